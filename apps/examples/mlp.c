/* mlp.c: trains a dense multi-layer perceptron through pooch's tensor-level
 * C API (the public header alone).
 *
 * Builds a model from a JSON spec, prints its inputs and outputs, makes a
 * small regression problem (two smooth functions of four inputs, plus
 * noise), trains on it for some epochs with pooch_session_set_input /
 * pooch_session_run / pooch_session_get_output, and predicts a few rows:
 *
 *   cc -std=c11 mlp.c $(pkg-config --cflags --libs pooch) -lm -o mlp
 *   ./mlp [EPOCHS (default 15)]
 *
 * Prints one line per epoch ("epoch 3 loss 0.012345") and exits 0 only when
 * the last epoch's loss is below half the first's.
 */
#include <math.h>
#include <pooch/pooch.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { ROWS = 1000, WIDTH = 4, OUTPUTS = 2 };

static const char* const kSpec =
    "{\"family\": \"mlp\","
    " \"input\": {\"kind\": \"dense\", \"width\": 4},"
    " \"outputs\": 2,"
    " \"layers\": [{\"type\": \"linear\", \"width\": 32, \"activation\": \"relu\"},"
    "            {\"type\": \"linear\", \"width\": 32, \"activation\": \"relu\"},"
    "            {\"type\": \"dense\"}],"
    " \"loss\": \"mse\","
    " \"batch\": 32,"
    " \"seed\": 1}";

/* A small deterministic generator (xorshift64*), uniform in [0, 1). */
static double uniform(uint64_t* s) {
  *s ^= *s >> 12;
  *s ^= *s << 25;
  *s ^= *s >> 27;
  return (double)((*s * 2685821657736338717ull) >> 11) / 9007199254740992.0;
}

/* x in [-1, 1)^4; y0 = sin(2 x0) + x1 x2, y1 = x3^2 - x0 / 2, plus noise. */
static void make_data(float* x, float* y) {
  uint64_t s = 0x9e3779b97f4a7c15ull;
  for (int r = 0; r < ROWS; ++r) {
    float* xr = x + r * WIDTH;
    for (int j = 0; j < WIDTH; ++j) xr[j] = (float)(2 * uniform(&s) - 1);
    const double noise0 = (uniform(&s) + uniform(&s) - 1) * 0.05;
    const double noise1 = (uniform(&s) + uniform(&s) - 1) * 0.05;
    y[r * OUTPUTS + 0] = (float)(sin(2 * xr[0]) + xr[1] * xr[2] + noise0);
    y[r * OUTPUTS + 1] = (float)(xr[3] * xr[3] - 0.5 * xr[0] + noise1);
  }
}

static const char* dtype_name(pooch_dtype t) {
  switch (t) {
    case POOCH_DTYPE_F32:
      return "f32";
    case POOCH_DTYPE_F64:
      return "f64";
    case POOCH_DTYPE_I32:
      return "i32";
    case POOCH_DTYPE_U16:
      return "u16";
    default:
      return "?";
  }
}

static void print_tensor(const char* kind, const pooch_tensor_info* t) {
  printf("%s %s: %s [", kind, t->name, dtype_name(t->dtype));
  for (int d = 0; d < t->rank; ++d) {
    if (t->shape[d] < 0)
      printf("%sbatch(%lld)", d ? ", " : "", (long long)t->max_rows);
    else
      printf("%s%lld", d ? ", " : "", (long long)t->shape[d]);
  }
  printf("], %zu bytes\n", t->bytes);
}

static int fail(const char* what, pooch_status st) {
  fprintf(stderr, "mlp: %s: %s: %s\n", what, pooch_status_str(st), pooch_last_error());
  return 1;
}

int main(int argc, char** argv) {
  const long epochs = argc > 1 ? strtol(argv[1], NULL, 10) : 15;
  if (argc > 2 || epochs < 2 || epochs > 1000) {
    fprintf(stderr, "usage: %s [EPOCHS (2 to 1000, default 15)]\n", argv[0]);
    return 1;
  }
  printf("pooch %s\n", pooch_version_str());

  static float x[ROWS * WIDTH], y[ROWS * OUTPUTS];
  make_data(x, y);

  pooch_model* model = NULL;
  pooch_session* session = NULL;
  float* prediction = NULL;
  int rc = 1;
  pooch_status st;

  if ((st = pooch_model_create_from_spec(kSpec, "mlp.c", &model)) != POOCH_OK) {
    rc = fail("model", st);
    goto done;
  }
  printf("family %s\n", pooch_model_family(model));
  pooch_tensor_info info;
  for (int i = 0; i < pooch_model_input_count(model); ++i) {
    if ((st = pooch_model_input_info(model, i, &info)) != POOCH_OK) {
      rc = fail("input info", st);
      goto done;
    }
    print_tensor("input", &info);
  }
  size_t prediction_bytes = 0;
  for (int i = 0; i < pooch_model_output_count(model); ++i) {
    if ((st = pooch_model_output_info(model, i, &info)) != POOCH_OK) {
      rc = fail("output info", st);
      goto done;
    }
    print_tensor("output", &info);
    if (strcmp(info.name, "prediction") == 0) prediction_bytes = info.bytes;
  }
  /* The planned rows per step: the batch dimension of batch.x. */
  if ((st = pooch_model_input_info(model, 0, &info)) != POOCH_OK) {
    rc = fail("input info", st);
    goto done;
  }
  const int batch = (int)info.max_rows;
  if (strcmp(info.name, "batch.x") != 0 || batch < 1 || prediction_bytes == 0) {
    fprintf(stderr, "mlp: the model's first input is not batch.x or it has no prediction\n");
    goto done;
  }

  pooch_session_params sp;
  pooch_session_default_params(&sp);
  sp.device = POOCH_DEVICE_CPU;
  sp.threads = 1;
  sp.learning_rate = 0.005f;
  if ((st = pooch_session_create(model, &sp, &session)) != POOCH_OK) {
    rc = fail("session", st);
    goto done;
  }

  /* Each epoch goes over the rows in order; 1000 rows in batches of 32 end
   * with a partial batch of 8 rows (the session pads it and the loss
   * ignores the padding). The epoch's loss is the mean over rows. */
  double first = 0, last = 0;
  for (long e = 1; e <= epochs; ++e) {
    double sum = 0;
    for (int r0 = 0; r0 < ROWS; r0 += batch) {
      const int rows = ROWS - r0 < batch ? ROWS - r0 : batch;
      float loss = 0;
      if ((st = pooch_session_set_input(session, "batch.x", x + (size_t)r0 * WIDTH,
                                        sizeof(float) * (size_t)rows * WIDTH)) != POOCH_OK ||
          (st = pooch_session_set_input(session, "batch.y", y + (size_t)r0 * OUTPUTS,
                                        sizeof(float) * (size_t)rows * OUTPUTS)) != POOCH_OK ||
          (st = pooch_session_run(session, POOCH_PROGRAM_TRAIN_STEP)) != POOCH_OK ||
          (st = pooch_session_get_output(session, "loss", &loss, sizeof loss)) != POOCH_OK) {
        rc = fail("training step", st);
        goto done;
      }
      sum += (double)loss * rows;
    }
    last = sum / ROWS;
    if (e == 1) first = last;
    printf("epoch %ld loss %.6f\n", e, last);
  }

  /* Predictions of the first three rows (FORWARD needs no targets). The
   * output holds the planned rows; the first `rows` are ours. */
  prediction = malloc(prediction_bytes);
  if (!prediction) {
    fprintf(stderr, "mlp: out of memory\n");
    goto done;
  }
  if ((st = pooch_session_set_input(session, "batch.x", x, sizeof(float) * 3 * WIDTH)) !=
          POOCH_OK ||
      (st = pooch_session_run(session, POOCH_PROGRAM_FORWARD)) != POOCH_OK ||
      (st = pooch_session_get_output(session, "prediction", prediction, prediction_bytes)) !=
          POOCH_OK) {
    rc = fail("forward", st);
    goto done;
  }
  for (int r = 0; r < 3; ++r)
    printf("row %d: predicted %.3f %.3f, true %.3f %.3f\n", r, (double)prediction[r * OUTPUTS],
           (double)prediction[r * OUTPUTS + 1], (double)y[r * OUTPUTS], (double)y[r * OUTPUTS + 1]);

  const int ok = last < 0.5 * first;
  printf("loss %.6f -> %.6f (%.1f%% of the first epoch's): %s\n", first, last,
         first > 0 ? 100 * last / first : 0.0, ok ? "ok" : "FAIL: the loss did not halve");
  rc = ok ? 0 : 1;

done:
  free(prediction);
  pooch_session_free(&session);
  pooch_model_free(&model);
  return rc;
}
