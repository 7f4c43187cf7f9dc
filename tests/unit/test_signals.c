/* The library installs no signal handlers: a host program's handlers (and
 * its defaults) are its own. Every signal's disposition (handler, flags and
 * mask) is recorded before the first pooch call and compared after loading,
 * creating, training (with 2 threads, so OpenMP and OpenBLAS start their
 * threads), predicting, saving, reloading and freeing, from C as an embedding
 * program calls it. A handler the host set before must survive too, so one
 * is installed for SIGUSR1 first. The signal mask of the calling thread must
 * be left as it was.
 *
 * Usage: test_signals (writes one model file under $TMPDIR or /tmp). */
#define _POSIX_C_SOURCE 200809L
#include <pooch/pooch.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_SIGNAL 65 /* 1..64: the classic signals and the real-time ones */

static int g_failures = 0;

static void host_handler(int sig) {
  (void)sig;
}

static int same_action(const struct sigaction* a, const struct sigaction* b) {
  if (a->sa_flags != b->sa_flags) return 0;
  if ((a->sa_flags & SA_SIGINFO) ? a->sa_sigaction != b->sa_sigaction
                                 : a->sa_handler != b->sa_handler)
    return 0;
  for (int s = 1; s < MAX_SIGNAL; ++s)
    if (sigismember(&a->sa_mask, s) != sigismember(&b->sa_mask, s)) return 0;
  return 1;
}

static void record(struct sigaction* all, int* valid) {
  for (int s = 1; s < MAX_SIGNAL; ++s) {
    memset(&all[s], 0, sizeof all[s]);
    valid[s] = sigaction(s, NULL, &all[s]) == 0;
  }
}

static void compare(const struct sigaction* before, const int* valid_before, const char* when) {
  struct sigaction now[MAX_SIGNAL];
  int valid[MAX_SIGNAL];
  record(now, valid);
  for (int s = 1; s < MAX_SIGNAL; ++s) {
    if (valid[s] != valid_before[s] || (valid[s] && !same_action(&before[s], &now[s]))) {
      ++g_failures;
      fprintf(stderr, "FAIL: signal %d (%s): its disposition changed %s\n", s, strsignal(s), when);
    }
  }
}

#define OK(call)                                                                        \
  do {                                                                                  \
    pooch_status st_ = (call);                                                          \
    if (st_ != POOCH_OK) {                                                              \
      fprintf(stderr, "FAIL (line %d): %s: %s\n", __LINE__, #call, pooch_last_error()); \
      exit(1);                                                                          \
    }                                                                                   \
  } while (0)

int main(void) {
  struct sigaction host;
  memset(&host, 0, sizeof host);
  host.sa_handler = host_handler;
  sigemptyset(&host.sa_mask);
  sigaddset(&host.sa_mask, SIGUSR2);
  host.sa_flags = SA_RESTART;
  if (sigaction(SIGUSR1, &host, NULL) != 0) {
    perror("sigaction");
    return 1;
  }
  sigset_t mask_before, mask_after;
  sigprocmask(SIG_SETMASK, NULL, &mask_before);

  struct sigaction before[MAX_SIGNAL];
  int valid[MAX_SIGNAL];
  record(before, valid);

  pooch_planted_params pp;
  pooch_planted_default_params(&pp);
  pp.rows = 256;
  pp.features = 200;
  pp.labels = 40;
  pooch_dataset* ds = NULL;
  OK(pooch_dataset_create_planted(&pp, &ds));

  pooch_xmc_params xp;
  pooch_xmc_default_params(&xp);
  xp.features = pp.features;
  xp.labels = pp.labels;
  xp.hidden = 64;
  xp.fan_in = 8;
  xp.batch_size = 32;
  pooch_model* model = NULL;
  OK(pooch_model_create_xmc(&xp, &model));

  pooch_session_params sp;
  pooch_session_default_params(&sp);
  sp.device = POOCH_DEVICE_CPU;
  sp.threads = 2;
  pooch_session* s = NULL;
  OK(pooch_session_create(model, &sp, &s));
  compare(before, valid, "by pooch_session_create");

  pooch_train_params tp;
  pooch_train_default_params(&tp);
  tp.epochs = 2;
  OK(pooch_train(s, ds, ds, &tp));
  compare(before, valid, "by pooch_train");

  pooch_batch b;
  OK(pooch_dataset_batch(ds, 0, 8, &b));
  int32_t labels[8 * 5];
  float scores[8 * 5];
  OK(pooch_session_predict(s, &b, 5, labels, scores));

  const char* tmp = getenv("TMPDIR");
  char path[4096];
  snprintf(path, sizeof path, "%s/pooch-signals-%ld.pooch", tmp && *tmp ? tmp : "/tmp",
           (long)getpid());
  OK(pooch_session_save(s, path));
  pooch_session_free(&s);
  pooch_model_free(&model);
  OK(pooch_model_load(path, &model));
  OK(pooch_session_create(model, &sp, &s));
  pooch_session_free(&s);
  pooch_model_free(&model);
  pooch_dataset_free(&ds);
  unlink(path);
  compare(before, valid, "after the sessions were freed");

  sigprocmask(SIG_SETMASK, NULL, &mask_after);
  for (int sig = 1; sig < MAX_SIGNAL; ++sig)
    if (sigismember(&mask_before, sig) != sigismember(&mask_after, sig)) {
      ++g_failures;
      fprintf(stderr, "FAIL: signal %d (%s) is %s in the calling thread's mask now\n", sig,
              strsignal(sig), sigismember(&mask_after, sig) ? "blocked" : "no longer blocked");
    }

  if (g_failures) {
    fprintf(stderr, "test_signals: %d failures\n", g_failures);
    return 1;
  }
  printf("test_signals: the dispositions of signals 1-%d and the thread's mask are unchanged\n",
         MAX_SIGNAL - 1);
  return 0;
}
