/* embed.c: a C program that embeds pooch through its public header alone.
 *
 * Loads a model (or checkpoint) and a bag-of-words data file and prints the
 * top-3 labels with scores of the first rows:
 *
 *   cc -std=c11 embed.c $(pkg-config --cflags --libs pooch) -o embed
 *   ./embed model.pooch test.txt [ROWS]
 *
 * Output, one line per row:  row 0: 12:0.9312 4:0.5108 7:0.3301 (true: 4 12)
 */
#include <pooch/pooch.h>
#include <stdio.h>
#include <stdlib.h>

static int fail(const char* what, pooch_status st) {
  fprintf(stderr, "embed: %s: %s: %s\n", what, pooch_status_str(st), pooch_last_error());
  return 1;
}

int main(int argc, char** argv) {
  if (argc < 3 || argc > 4) {
    fprintf(stderr, "usage: %s MODEL.pooch DATA.txt [ROWS (default 5)]\n", argv[0]);
    return 1;
  }
  long rows_wanted = argc == 4 ? strtol(argv[3], NULL, 10) : 5;
  if (rows_wanted < 1 || rows_wanted > 4096) {
    fprintf(stderr, "embed: ROWS must be between 1 and 4096\n");
    return 1;
  }
  enum { K = 3 };

  printf("pooch %s\n", pooch_version_str());
  pooch_model* model = NULL;
  pooch_dataset* data = NULL;
  pooch_session* session = NULL;
  int32_t* labels = NULL;
  float* scores = NULL;
  int rc = 1;
  pooch_status st;

  if ((st = pooch_model_load(argv[1], &model)) != POOCH_OK) {
    rc = fail(argv[1], st);
    goto done;
  }
  if ((st = pooch_dataset_load(argv[2], &data)) != POOCH_OK) {
    rc = fail(argv[2], st);
    goto done;
  }
  int64_t rows = 0, features = 0, nlabels = 0;
  pooch_dataset_shape(data, &rows, &features, &nlabels);
  if (rows < rows_wanted) rows_wanted = (long)rows;
  if (rows_wanted == 0) {
    fprintf(stderr, "embed: %s has no rows\n", argv[2]);
    goto done;
  }
  pooch_batch batch;
  if ((st = pooch_dataset_batch(data, 0, rows_wanted, &batch)) != POOCH_OK) {
    rc = fail("batch", st);
    goto done;
  }
  /* One step predicts all the rows we want (so the batch holds rows_wanted
   * rows and all their nonzeros), with at least K labels per row. */
  int64_t nnz = batch.row_ptr[batch.rows] - batch.row_ptr[0];
  if ((st = pooch_model_set_run_shape(model, rows_wanted, nnz > 0 ? nnz : 0, K)) != POOCH_OK) {
    rc = fail("run shape", st);
    goto done;
  }

  pooch_session_params sp;
  pooch_session_default_params(&sp);
  sp.device = POOCH_DEVICE_CPU;
  sp.threads = 1;
  if ((st = pooch_session_create(model, &sp, &session)) != POOCH_OK) {
    rc = fail("session", st);
    goto done;
  }

  labels = malloc(sizeof(int32_t) * (size_t)batch.rows * K);
  scores = malloc(sizeof(float) * (size_t)batch.rows * K);
  if (!labels || !scores) {
    fprintf(stderr, "embed: out of memory\n");
    goto done;
  }
  if ((st = pooch_session_predict(session, &batch, K, labels, scores)) != POOCH_OK) {
    rc = fail("predict", st);
    goto done;
  }
  for (int64_t r = 0; r < batch.rows; ++r) {
    printf("row %lld:", (long long)r);
    for (int j = 0; j < K; ++j)
      printf(" %d:%.4f", (int)labels[r * K + j], (double)scores[r * K + j]);
    printf(" (true:");
    for (int64_t j = batch.label_ptr[r]; j < batch.label_ptr[r + 1]; ++j)
      printf(" %d", (int)batch.label[j]);
    printf(")\n");
  }
  rc = 0;

done:
  free(labels);
  free(scores);
  pooch_session_free(&session);
  pooch_dataset_free(&data);
  pooch_model_free(&model);
  return rc;
}
