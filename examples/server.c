// An OpenAI-compatible server in a program of your own: nm_server with one
// LLM brick (llama-server's routes: /v1/chat/completions, /v1/completions,
// /v1/models, /health, /metrics). Ctrl-C or SIGTERM stops it, finishing the
// requests in flight.
//   cc -o server examples/server.c $(pkg-config --cflags --libs nanomind)
//   ./server SmolLM2-135M-Instruct.Q4_1.gguf 8080     (port 0: one the system picks)
#define _POSIX_C_SOURCE 200809L
#include <nanomind.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s MODEL.gguf PORT\n", argv[0]);
        return 2;
    }
    nm_brick_params llm = nm_brick_default_params(NM_BRICK_LLM); // the model's template, context, sampling
    llm.model = argv[1];
    nm_server_params sp = nm_server_default_params(); // 127.0.0.1, no key, a request at a time
    sp.llm = &llm;
    sp.port = atoi(argv[2]);
    sigset_t stop; // the server's threads inherit the mask: the signals come to sigwait below
    sigemptyset(&stop);
    sigaddset(&stop, SIGINT);
    sigaddset(&stop, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &stop, NULL);
    nm_server *s;
    char err[1024];
    if (nm_server_start(&sp, &s, err, sizeof err) != NM_OK) {
        fprintf(stderr, "error: %s\n", err);
        return 1;
    }
    printf("listening on http://127.0.0.1:%d\n", (int)nm_server_port(s));
    fflush(stdout);
    int sig;
    sigwait(&stop, &sig);
    nm_server_stop(s, 60); // new requests: 503; those in flight get a minute to end
    return 0;
}
