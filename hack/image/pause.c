/* A pod sandbox's pause process: hold the namespaces, reap orphans, exit 0 on SIGINT or SIGTERM. */
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int sig) {
  (void)sig;
  _exit(0);
}

static void reap(int sig) {
  (void)sig;
  while (waitpid(-1, NULL, WNOHANG) > 0) {
  }
}

int main(void) {
  struct sigaction stop_action = {.sa_handler = stop};
  struct sigaction reap_action = {.sa_handler = reap, .sa_flags = SA_NOCLDSTOP | SA_RESTART};
  sigemptyset(&stop_action.sa_mask);
  sigemptyset(&reap_action.sa_mask);
  if (sigaction(SIGINT, &stop_action, NULL) < 0 || sigaction(SIGTERM, &stop_action, NULL) < 0 ||
      sigaction(SIGCHLD, &reap_action, NULL) < 0) {
    return 1;
  }
  for (;;) {
    pause();
  }
}
