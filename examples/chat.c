// A chat with a language model: nm_pipeline with one LLM brick (llama.cpp's
// simple-chat, in the library's terms). A turn a line of stdin; EOF ends it.
//   cc -o chat examples/chat.c $(pkg-config --cflags --libs nanomind)
//   ./chat SmolLM2-135M-Instruct.Q4_1.gguf
#include <nanomind.h>
#include <stdio.h>
#include <string.h>

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s MODEL.gguf\n", argv[0]);
        return 2;
    }
    nm_brick_params llm = nm_brick_default_params(NM_BRICK_LLM); // the model's template, context, sampling
    llm.model = argv[1];
    llm.llm.n_predict = -1;      // each answer to its end
    nm_pipeline_params pp = nm_pipeline_default_params();
    pp.llm = &llm;
    pp.keep_history = true;      // a conversation: each turn after the earlier ones
    nm_pipeline *p;
    char err[512], line[4096];
    if (nm_pipeline_create(&pp, &p, err, sizeof err) != NM_OK) {
        fprintf(stderr, "error: %s\n", err);
        return 1;
    }
    int rc = 0;
    while (fputs("> ", stderr), fgets(line, sizeof line, stdin)) {
        line[strcspn(line, "\n")] = '\0';
        if (!line[0]) continue;
        if (nm_pipeline_submit(p, &(nm_pipeline_input){.text = line}, NULL, err, sizeof err) != NM_OK) {
            fprintf(stderr, "error: %s\n", err);
            rc = 1;
            break;
        }
        nm_pipeline_event ev = {0};
        while (nm_pipeline_read(p, -1, &ev) == NM_OK && ev.kind != NM_PIPELINE_DONE)
            if (ev.kind == NM_PIPELINE_TEXT) fwrite(ev.text, 1, ev.len, stdout), fflush(stdout);
        if (ev.status != NM_OK) fprintf(stderr, "error: %s\n", ev.text);
        putchar('\n');
    }
    nm_pipeline_free(p);
    return rc;
}
