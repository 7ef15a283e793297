/* LD_PRELOAD for tests/launch/test_teardown.py: gloo's exit race, hit for certain once it is
   reached. While the file $DDPKIT_TEST_HOLD_FLAG exists, a gloo worker thread
   (pt_gloo_runloop) that asks for the GIL keeps running for $DDPKIT_TEST_HOLD_MS first, as
   a thread preempted at that point stays off the CPU. A worker asks for the GIL when it drops
   the last reference to a finished work that captured a Python object (train/teardown.py). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec / 1e9;
}

void PyEval_AcquireThread(void *tstate) {
  static void (*real)(void *);
  if (!real) real = (void (*)(void *))dlsym(RTLD_NEXT, "PyEval_AcquireThread");
  const char *flag = getenv("DDPKIT_TEST_HOLD_FLAG");
  char name[16] = {0};
  prctl(PR_GET_NAME, name, 0, 0, 0);
  if (flag && strcmp(name, "pt_gloo_runloop") == 0 && access(flag, F_OK) == 0) {
    static const char said[] = "ddpkit-test: a gloo thread is held before the GIL\n";
    const char *ms = getenv("DDPKIT_TEST_HOLD_MS");
    double end = now_s() + (ms ? atof(ms) : 1000.0) / 1000.0;
    write(2, said, sizeof said - 1);
    while (now_s() < end) {
    }
  }
  real(tstate);
}
