/* Generation through the C API, from C (C11), as an embedding program does
 * it: a tiny gpt model made from a spec, trained a few steps on a cyclic
 * sequence through pooch_session_run, then pooch_generate with a per-token
 * callback (greedy continues the cycle; the callback stops it; a seed gives
 * the same samples twice), and refused arguments.
 *
 * Usage: test_api_generate */
#include <pooch/pooch.h>
#include <stdio.h>
#include <string.h>

static int g_checks = 0;
static int g_failures = 0;

static void check(int ok, const char* what, int line) {
  ++g_checks;
  if (!ok) {
    ++g_failures;
    fprintf(stderr, "FAIL (line %d): %s (%s)\n", line, what, pooch_last_error());
  }
}
#define CHECK(cond) check((cond) != 0, #cond, __LINE__)

enum { V = 13, B = 4, T = 8 };

typedef struct {
  int calls;
  int stop_after; /* 0: never stop */
  int32_t seen[64];
} stream;

static int on_token(void* user, int32_t token, int64_t index) {
  stream* s = (stream*)user;
  if (index != s->calls) return 0; /* indices must count up from 0 */
  if (s->calls < 64) s->seen[s->calls] = token;
  ++s->calls;
  return s->stop_after == 0 || s->calls < s->stop_after;
}

int main(void) {
  const char* spec =
      "{\"family\": \"gpt\", \"n_layer\": 1, \"n_head\": 2, \"n_embd\": 16, \"n_ctx\": 12,"
      " \"vocab_size\": 13, \"batch\": 4, \"seq\": 8, \"seed\": 5}";
  pooch_model* m = NULL;
  CHECK(pooch_model_create_from_spec(spec, "spec", &m) == POOCH_OK);
  CHECK(strcmp(pooch_model_family(m), "gpt") == 0);
  pooch_session_params sp;
  pooch_session_default_params(&sp);
  sp.device = POOCH_DEVICE_CPU;
  sp.threads = 1;
  sp.optimizer = POOCH_OPT_ADAMW;
  sp.learning_rate = 1e-2f;
  pooch_session* s = NULL;
  CHECK(pooch_session_create(m, &sp, &s) == POOCH_OK);
  if (!s) return 1;

  /* Each token is followed by the next one, modulo V. */
  int32_t tokens[B * T], targets[B * T];
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t) {
      tokens[b * T + t] = (3 * b + t) % V;
      targets[b * T + t] = (3 * b + t + 1) % V;
    }
  CHECK(pooch_session_set_input(s, "batch.tokens", tokens, sizeof tokens) == POOCH_OK);
  CHECK(pooch_session_set_input(s, "batch.targets", targets, sizeof targets) == POOCH_OK);
  float loss = 0;
  for (int i = 0; i < 150; ++i) CHECK(pooch_session_run(s, POOCH_PROGRAM_TRAIN_STEP) == POOCH_OK);
  CHECK(pooch_session_get_output(s, "loss", &loss, sizeof loss) == POOCH_OK);
  CHECK(loss < 0.2f);

  /* Greedy: the cycle continues, every token streamed as it comes. */
  pooch_generate_params gp;
  pooch_generate_default_params(&gp);
  gp.temperature = 0;
  gp.max_tokens = 5;
  const int32_t prompt[3] = {4, 5, 6};
  int32_t out[8] = {0};
  int64_t n = -1;
  stream st = {0, 0, {0}};
  CHECK(pooch_generate(s, prompt, 3, &gp, on_token, &st, out, 8, &n) == POOCH_OK);
  CHECK(n == 5);
  CHECK(st.calls == 5);
  for (int i = 0; i < 5; ++i) {
    CHECK(out[i] == (7 + i) % V);
    CHECK(st.seen[i] == out[i]);
  }

  /* The callback stops it. */
  stream stop = {0, 2, {0}};
  gp.max_tokens = 5;
  CHECK(pooch_generate(s, prompt, 3, &gp, on_token, &stop, out, 8, &n) == POOCH_OK);
  CHECK(stop.calls == 2 && n == 2);

  /* Sampling: a seed gives the same tokens twice; streamed only (no out). */
  gp.temperature = 1.5;
  gp.top_k = 5;
  gp.top_p = 0.95;
  gp.seed = 42;
  gp.max_tokens = 6;
  stream a = {0, 0, {0}}, b = {0, 0, {0}};
  CHECK(pooch_generate(s, prompt, 3, &gp, on_token, &a, NULL, 0, NULL) == POOCH_OK);
  CHECK(pooch_generate(s, prompt, 3, &gp, on_token, &b, NULL, 0, NULL) == POOCH_OK);
  CHECK(a.calls == 6 && b.calls == 6 && memcmp(a.seen, b.seen, sizeof(int32_t) * 6) == 0);

  /* Refused, with a message. */
  const int32_t bad[1] = {V};
  CHECK(pooch_generate(NULL, prompt, 3, &gp, NULL, NULL, NULL, 0, NULL) == POOCH_ERR_INVALID_ARG);
  CHECK(pooch_generate(s, NULL, 3, &gp, NULL, NULL, NULL, 0, NULL) == POOCH_ERR_INVALID_ARG);
  CHECK(pooch_generate(s, prompt, 0, &gp, NULL, NULL, NULL, 0, NULL) == POOCH_ERR_INVALID_ARG);
  CHECK(pooch_generate(s, prompt, 3, NULL, NULL, NULL, NULL, 0, NULL) == POOCH_ERR_INVALID_ARG);
  CHECK(pooch_generate(s, prompt, 3, &gp, NULL, NULL, NULL, 4, NULL) == POOCH_ERR_INVALID_ARG);
  CHECK(pooch_generate(s, bad, 1, &gp, NULL, NULL, NULL, 0, NULL) == POOCH_ERR_INVALID_ARG);
  CHECK(strstr(pooch_last_error(), "token") != NULL);
  gp.temperature = -1;
  CHECK(pooch_generate(s, prompt, 3, &gp, NULL, NULL, NULL, 0, NULL) == POOCH_ERR_INVALID_ARG);
  CHECK(strstr(pooch_last_error(), "temperature") != NULL);
  pooch_generate_default_params(NULL);

  pooch_session_free(&s);
  pooch_model_free(&m);
  printf("%d checks, %d failures\n", g_checks, g_failures);
  return g_failures ? 1 : 0;
}
