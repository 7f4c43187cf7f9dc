/* The C API under hostile calls, from C (C11), as an embedding program calls
 * it: NULL handles, NULL out pointers, out-of-range indices and enums,
 * batches with NULL arrays, handles freed twice. Every call must return an
 * error status with a message (or, for the calls without a status, a
 * harmless value) and never crash: a crash fails this test by itself.
 *
 * What C cannot check: a handle used after it was freed through a *copy* of
 * the pointer (pooch_session_free(&s) nulls `s`, not a second variable
 * holding the same address). The library hands out raw pointers, not
 * indices into a handle table, so such a dangling pointer is as undetectable
 * as it is for free(); there is deliberately no test of it here.
 *
 * Usage: test_api_hostile (writes its files under $TMPDIR or /tmp). */
#define _POSIX_C_SOURCE 200809L
#include <pooch/pooch.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int g_checks = 0;
static int g_failures = 0;

static void check(int ok, const char* what, int line) {
  ++g_checks;
  if (!ok) {
    ++g_failures;
    fprintf(stderr, "FAIL (line %d): %s\n", line, what);
  }
}
#define CHECK(cond) check((cond) != 0, #cond, __LINE__)

/* A hostile call: an error status (not OK, not an internal error) and a
 * message saying what was wrong. */
static void check_refused(pooch_status st, pooch_status want, const char* call, int line) {
  ++g_checks;
  const char* msg = pooch_last_error();
  if (st != want || msg == NULL || msg[0] == '\0') {
    ++g_failures;
    fprintf(stderr, "FAIL (line %d): %s returned %d (%s), wanted %d; message '%s'\n", line, call,
            (int)st, pooch_status_str(st), (int)want, msg ? msg : "(null)");
  }
}
#define REFUSED(call) check_refused((call), POOCH_ERR_INVALID_ARG, #call, __LINE__)
#define REFUSED_AS(want, call) check_refused((call), (want), #call, __LINE__)
#define OK(call) check((call) == POOCH_OK, #call, __LINE__)

static void quiet_log(void* user, pooch_log_level level, const char* message) {
  (void)user;
  (void)level;
  (void)message;
}

static void test_global_calls(void) {
  CHECK(strcmp(pooch_status_str((pooch_status)12345), "unknown status") == 0);
  CHECK(strcmp(pooch_status_str((pooch_status)-12345), "unknown status") == 0);
  CHECK(pooch_last_error() != NULL);
  CHECK(pooch_version_str() != NULL);
  /* Parameter defaults into NULL: nothing to fill, nothing to crash. */
  pooch_xmc_default_params(NULL);
  pooch_session_default_params(NULL);
  pooch_planted_default_params(NULL);
  pooch_train_default_params(NULL);
  pooch_propensity_defaults(NULL, NULL, NULL);
  float a = 0.f, b = 0.f;
  pooch_propensity_defaults(NULL, &a, &b);
  CHECK(a > 0.f && b > 0.f);
  pooch_set_log(quiet_log, NULL, (pooch_log_level)99);
  pooch_set_log(NULL, NULL, POOCH_LOG_ERROR);
  pooch_string_free(NULL);
  char* s = NULL;
  pooch_string_free(&s);
  pooch_string_free(&s);
  CHECK(s == NULL);
}

static void test_model_calls(const char* dir) {
  pooch_xmc_params xp;
  pooch_xmc_default_params(&xp);
  xp.features = 50;
  xp.labels = 10;
  xp.hidden = 8;
  xp.fan_in = 4;
  xp.batch_size = 4;
  pooch_model* m = NULL;
  REFUSED(pooch_model_create_xmc(NULL, &m));
  CHECK(m == NULL);
  REFUSED(pooch_model_create_xmc(&xp, NULL));
  xp.loss = (pooch_loss)77;
  REFUSED(pooch_model_create_xmc(&xp, &m));
  CHECK(m == NULL);
  xp.loss = POOCH_LOSS_BCE;
  REFUSED(pooch_model_create_from_spec(NULL, NULL, &m));
  REFUSED(pooch_model_create_from_spec("{\"features\": 5}", NULL, NULL));
  REFUSED_AS(POOCH_ERR_BAD_INPUT, pooch_model_create_from_spec("{\"layers\": 3}", NULL, &m));
  CHECK(m == NULL);
  REFUSED(pooch_model_load(NULL, &m));
  REFUSED(pooch_model_load("model.pooch", NULL));
  REFUSED(pooch_model_replace_head(NULL, 4));
  REFUSED(pooch_model_set_run_shape(NULL, 4, 0, 0));
  REFUSED(pooch_model_set_max_labels(NULL, 0));
  CHECK(pooch_model_spec_json(NULL) != NULL && pooch_model_spec_json(NULL)[0] == '\0');
  CHECK(pooch_model_is_checkpoint(NULL) == 0);
  CHECK(pooch_model_input_count(NULL) == 0);
  CHECK(pooch_model_output_count(NULL) == 0);
  CHECK(pooch_model_family(NULL) != NULL && pooch_model_family(NULL)[0] == '\0');
  pooch_tensor_info info;
  REFUSED(pooch_model_input_info(NULL, 0, &info));
  REFUSED(pooch_model_output_info(NULL, 0, &info));

  OK(pooch_model_create_xmc(&xp, &m));
  CHECK(m != NULL);
  REFUSED(pooch_model_input_info(m, 0, NULL));
  REFUSED(pooch_model_output_info(m, 0, NULL));
  REFUSED(pooch_model_input_info(m, -1, &info));
  REFUSED(pooch_model_input_info(m, 1 << 30, &info));
  REFUSED(pooch_model_output_info(m, pooch_model_output_count(m), &info));
  REFUSED(pooch_model_replace_head(m, 0));
  REFUSED(pooch_model_replace_head(m, -5));
  REFUSED(pooch_model_set_run_shape(m, -1, 0, 0));
  REFUSED(pooch_model_set_max_labels(m, -1));
  CHECK(strcmp(pooch_model_family(m), "xmc") == 0);

  /* The file calls: NULL paths and out pointers. */
  char* json = NULL;
  REFUSED(pooch_file_describe(NULL, &json));
  CHECK(json == NULL);
  REFUSED(pooch_file_describe("model.pooch", NULL));
  char missing[600];
  snprintf(missing, sizeof missing, "%s/no-such-file.pooch", dir);
  REFUSED_AS(POOCH_ERR_IO, pooch_file_describe(missing, &json));
  CHECK(json == NULL);

  /* Freed twice: the first call nulls the handle, the second sees NULL. */
  pooch_model_free(&m);
  CHECK(m == NULL);
  pooch_model_free(&m);
  pooch_model_free(NULL);
  CHECK(m == NULL);
}

static pooch_model* small_model(void) {
  pooch_xmc_params xp;
  pooch_xmc_default_params(&xp);
  xp.features = 200;
  xp.labels = 40;
  xp.hidden = 16;
  xp.fan_in = 4;
  xp.batch_size = 8;
  pooch_model* m = NULL;
  OK(pooch_model_create_xmc(&xp, &m));
  return m;
}

static void test_dataset_calls(const char* dir) {
  pooch_planted_params pp;
  pooch_planted_default_params(&pp);
  pp.rows = 64;
  pp.features = 200;
  pp.labels = 40;
  pooch_dataset* ds = NULL;
  REFUSED(pooch_dataset_create_planted(NULL, &ds));
  REFUSED(pooch_dataset_create_planted(&pp, NULL));
  int64_t rows = -1, features = -1, labels = -1;
  REFUSED(pooch_dataset_shape(NULL, &rows, &features, &labels));
  pooch_batch b;
  REFUSED(pooch_dataset_batch(NULL, 0, 1, &b));
  REFUSED(pooch_dataset_load(NULL, &ds));
  REFUSED(pooch_dataset_load("data.txt", NULL));
  REFUSED(pooch_dataset_load_split(NULL, "y.txt", &ds));
  REFUSED(pooch_dataset_load_split("x.txt", NULL, &ds));
  REFUSED(pooch_dataset_load_split("x.txt", "y.txt", NULL));
  REFUSED(pooch_dataset_save(NULL, "data.txt"));
  CHECK(pooch_dataset_max_batch_nnz(NULL, 8) == 0);
  CHECK(pooch_dataset_max_batch_labels(NULL, 8) == 0);
  CHECK(pooch_dataset_is_dense(NULL) == 0);
  pooch_dataset *train = NULL, *test = NULL;
  REFUSED(pooch_dataset_create_synth(NULL, 0.01, 1, &train, &test));
  REFUSED(pooch_dataset_create_synth("EURLex-4K", 0.01, 1, NULL, &test));
  REFUSED(pooch_dataset_create_synth("EURLex-4K", 0.01, 1, &train, NULL));
  CHECK(train == NULL && test == NULL);

  OK(pooch_dataset_create_planted(&pp, &ds));
  /* The shape's outputs are each optional. */
  OK(pooch_dataset_shape(ds, NULL, NULL, NULL));
  OK(pooch_dataset_shape(ds, &rows, NULL, NULL));
  CHECK(rows == 64);
  REFUSED(pooch_dataset_batch(ds, 0, 1, NULL));
  REFUSED(pooch_dataset_batch(ds, -1, 1, &b));
  REFUSED(pooch_dataset_batch(ds, 65, 1, &b));
  REFUSED(pooch_dataset_batch(ds, 0, -1, &b));
  REFUSED(pooch_dataset_save(ds, NULL));
  CHECK(pooch_dataset_max_batch_nnz(ds, 0) == 0);
  CHECK(pooch_dataset_max_batch_nnz(ds, -3) == 0);
  CHECK(pooch_dataset_max_batch_labels(ds, -3) == 0);
  CHECK(pooch_dataset_max_batch_nnz(ds, 1000000) > 0);

  /* An empty data set (0 rows) answers every query. */
  pooch_dataset* empty = NULL;
  pp.rows = 0;
  OK(pooch_dataset_create_planted(&pp, &empty));
  CHECK(pooch_dataset_max_batch_nnz(empty, 8) == 0);
  CHECK(pooch_dataset_max_batch_labels(empty, 8) == 0);
  OK(pooch_dataset_batch(empty, 0, 8, &b));
  CHECK(b.rows == 0);
  char path[600];
  snprintf(path, sizeof path, "%s/empty.txt", dir);
  OK(pooch_dataset_save(empty, path));
  pooch_dataset_free(&empty);

  pooch_dataset_free(&ds);
  CHECK(ds == NULL);
  pooch_dataset_free(&ds);
  pooch_dataset_free(NULL);
}

/* Every session call with a NULL session, NULL arguments and NULL out
 * pointers, on a live session. */
static void test_session_calls(const char* dir) {
  pooch_model* m = small_model();
  pooch_session_params sp;
  pooch_session_default_params(&sp);
  sp.device = POOCH_DEVICE_CPU;
  sp.threads = 1;
  pooch_session* s = NULL;
  REFUSED(pooch_session_create(NULL, &sp, &s));
  CHECK(s == NULL);
  REFUSED(pooch_session_create(m, NULL, &s));
  REFUSED(pooch_session_create(m, &sp, NULL));
  sp.threads = -1;
  REFUSED(pooch_session_create(m, &sp, &s));
  sp.threads = 1;
  sp.strategy = 1000;
  REFUSED(pooch_session_create(m, &sp, &s));
  sp.strategy = POOCH_STRATEGY_AUTO;
  /* Enum fields holding no enumerator: refused, not taken for the default. */
  sp.device = (pooch_device)77;
  REFUSED(pooch_session_create(m, &sp, &s));
  sp.device = POOCH_DEVICE_CPU;
  sp.optimizer = (pooch_optimizer)-3;
  REFUSED(pooch_session_create(m, &sp, &s));
  sp.optimizer = POOCH_OPT_ADAM;
  sp.learning_rate = 0.f;
  REFUSED(pooch_session_create(m, &sp, &s));
  sp.learning_rate = 1e-3f;
  CHECK(s == NULL);

  pooch_planted_params pp;
  pooch_planted_default_params(&pp);
  pp.rows = 64;
  pp.features = 200;
  pp.labels = 40;
  pooch_dataset* ds = NULL;
  OK(pooch_dataset_create_planted(&pp, &ds));
  pooch_batch batch;
  OK(pooch_dataset_batch(ds, 0, 8, &batch));
  float loss = 0.f;
  int32_t top[8 * 5];
  float scores[8 * 5];
  pooch_memory_report report;
  size_t bytes = 0;
  float buf[64];
  char path[600];
  snprintf(path, sizeof path, "%s/s.pooch", dir);
  pooch_train_params tp;
  pooch_train_default_params(&tp);
  tp.epochs = 1;
  pooch_metrics metrics;

  /* NULL session. */
  REFUSED(pooch_session_step(NULL, &batch, &loss));
  REFUSED(pooch_session_predict(NULL, &batch, 5, top, scores));
  REFUSED(pooch_session_set_input(NULL, "batch.ptr", buf, sizeof buf));
  REFUSED(pooch_session_run(NULL, POOCH_PROGRAM_FORWARD));
  REFUSED(pooch_session_get_output(NULL, "loss", buf, 4));
  REFUSED(pooch_session_memory(NULL, &report));
  REFUSED(pooch_session_save(NULL, path));
  REFUSED(pooch_session_read_tensor(NULL, "head.weight", NULL, &bytes));
  REFUSED(pooch_train(NULL, ds, NULL, &tp));
  REFUSED(pooch_evaluate(NULL, ds, NULL, 0.55f, 1.5f, &metrics));
  pooch_session_cancel(NULL);
  CHECK(access(path, F_OK) != 0);

  OK(pooch_session_create(m, &sp, &s));
  CHECK(s != NULL);
  /* The session keeps what it needs of its model: the model may go first. */
  pooch_model_free(&m);

  /* NULL arguments and out pointers on a live session. */
  REFUSED(pooch_session_step(s, NULL, &loss));
  OK(pooch_session_step(s, &batch, NULL)); /* the loss is optional */
  REFUSED(pooch_session_predict(s, NULL, 5, top, scores));
  REFUSED(pooch_session_predict(s, &batch, 5, NULL, NULL));
  REFUSED(pooch_session_predict(s, &batch, 0, top, scores));
  REFUSED(pooch_session_predict(s, &batch, 6, top, scores));
  REFUSED(pooch_session_predict(s, &batch, -1, top, scores));
  REFUSED(pooch_session_set_input(s, NULL, buf, sizeof buf));
  REFUSED(pooch_session_set_input(s, "batch.ptr", NULL, sizeof buf));
  REFUSED(pooch_session_set_input(s, "no.such.input", buf, sizeof buf));
  REFUSED(pooch_session_run(s, (pooch_program)-1));
  REFUSED(pooch_session_run(s, (pooch_program)3));
  REFUSED(pooch_session_get_output(s, NULL, buf, 4));
  REFUSED(pooch_session_get_output(s, "loss", NULL, 4));
  REFUSED(pooch_session_get_output(s, "loss", NULL, 0));
  REFUSED(pooch_session_get_output(s, "loss", buf, 3));
  REFUSED(pooch_session_memory(s, NULL));
  REFUSED(pooch_session_save(s, NULL));
  REFUSED(pooch_session_read_tensor(s, NULL, NULL, &bytes));
  REFUSED(pooch_session_read_tensor(s, "head.weight", NULL, NULL));
  REFUSED(pooch_session_read_tensor(s, "head.weight", buf, NULL));
  REFUSED(pooch_session_read_tensor(s, "no.such.tensor", NULL, &bytes));
  bytes = 1;
  REFUSED(pooch_session_read_tensor(s, "head.weight", buf, &bytes));
  REFUSED(pooch_train(s, NULL, NULL, &tp));
  REFUSED(pooch_train(s, ds, NULL, NULL));
  REFUSED(pooch_evaluate(s, NULL, NULL, 0.55f, 1.5f, &metrics));
  REFUSED(pooch_evaluate(s, ds, NULL, 0.55f, 1.5f, NULL));

  /* Batches whose arrays are NULL. */
  pooch_batch bad = batch;
  bad.row_ptr = NULL;
  REFUSED(pooch_session_step(s, &bad, &loss));
  REFUSED(pooch_session_predict(s, &bad, 5, top, scores));
  bad = batch;
  bad.col = NULL;
  REFUSED(pooch_session_step(s, &bad, &loss));
  bad = batch;
  bad.val = NULL;
  REFUSED(pooch_session_predict(s, &bad, 5, top, scores));
  bad = batch;
  bad.label_ptr = NULL;
  REFUSED(pooch_session_step(s, &bad, &loss));
  bad = batch;
  bad.label = NULL;
  REFUSED(pooch_session_step(s, &bad, &loss));
  bad = batch;
  bad.rows = -1;
  REFUSED(pooch_session_step(s, &bad, &loss));
  bad.rows = 1 << 20;
  REFUSED(pooch_session_step(s, &bad, &loss));

  /* After all that the session still works. */
  OK(pooch_session_step(s, &batch, &loss));
  CHECK(loss > 0.f);
  OK(pooch_session_predict(s, &batch, 5, top, NULL)); /* one of the two may be NULL */
  OK(pooch_session_memory(s, &report));
  CHECK(report.arena_bytes > 0);
  OK(pooch_session_read_tensor(s, "head.weight", NULL, &bytes));
  CHECK(bytes > 0);

  /* A session freed, then freed again through its (now NULL) handle, and
   * every call on the NULL handle it left. */
  pooch_session_free(&s);
  CHECK(s == NULL);
  pooch_session_free(&s);
  pooch_session_free(NULL);
  pooch_session_cancel(s);
  REFUSED(pooch_session_step(s, &batch, &loss));
  REFUSED(pooch_session_run(s, POOCH_PROGRAM_TRAIN_STEP));
  REFUSED(pooch_session_memory(s, &report));
  REFUSED(pooch_train(s, ds, NULL, &tp));
  pooch_dataset_free(&ds);
}

/* Wrong-family calls: the XMC calls on a dense (mlp) model's session. */
static void test_wrong_family(void) {
  const char* spec =
      "{\"family\": \"mlp\", \"input\": {\"kind\": \"dense\", \"width\": 6}, \"outputs\": 3,"
      " \"layers\": [{\"type\": \"linear\", \"width\": 4}, {\"type\": \"dense\"}],"
      " \"loss\": \"mse\", \"batch\": 4}";
  pooch_model* m = NULL;
  pooch_status st = pooch_model_create_from_spec(spec, "mlp spec", &m);
  CHECK(st == POOCH_OK);
  if (st != POOCH_OK) {
    fprintf(stderr, "mlp spec refused: %s\n", pooch_last_error());
    return;
  }
  pooch_session_params sp;
  pooch_session_default_params(&sp);
  sp.device = POOCH_DEVICE_CPU;
  sp.threads = 1;
  pooch_session* s = NULL;
  OK(pooch_session_create(m, &sp, &s));
  if (s) {
    pooch_batch b;
    memset(&b, 0, sizeof b);
    float loss;
    REFUSED(pooch_session_step(s, &b, &loss));
    int32_t top[5];
    REFUSED(pooch_session_predict(s, &b, 1, top, NULL));
  }
  pooch_session_free(&s);
  pooch_model_free(&m);
}

int main(void) {
  const char* tmp = getenv("TMPDIR");
  char dir[256];
  snprintf(dir, sizeof dir, "%s/pooch-hostile.XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
  if (!mkdtemp(dir)) {
    perror("mkdtemp");
    return 1;
  }
  pooch_set_log(quiet_log, NULL, POOCH_LOG_ERROR);
  test_global_calls();
  test_model_calls(dir);
  test_dataset_calls(dir);
  test_session_calls(dir);
  test_wrong_family();

  char path[600];
  snprintf(path, sizeof path, "%s/empty.txt", dir);
  unlink(path);
  snprintf(path, sizeof path, "%s/empty.txt.pcache", dir);
  unlink(path);
  rmdir(dir);
  printf("%d checks, %d failed\n", g_checks, g_failures);
  return g_failures == 0 ? 0 : 1;
}
