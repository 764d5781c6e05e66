// Speech to text: nm_pipeline with one STT brick (Whisper; whisper.cpp's
// simplest example, in the library's terms). Each file's segments, timed.
//   cc -o transcribe examples/transcribe.c $(pkg-config --cflags --libs nanomind)
//   ./transcribe whisper-tiny.en.gguf speech.wav [more.flac ...]
#include <nanomind.h>
#include <stdio.h>

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s WHISPER.gguf AUDIO...  (WAV, FLAC, MP3, OGG)\n", argv[0]);
        return 2;
    }
    nm_brick_params stt = nm_brick_default_params(NM_BRICK_STT);
    stt.model = argv[1];
    nm_pipeline_params pp = nm_pipeline_default_params();
    pp.stt = &stt;
    pp.max_audio_s = 600;        // files of up to ten minutes
    nm_pipeline *p;
    char err[512];
    if (nm_pipeline_create(&pp, &p, err, sizeof err) != NM_OK) {
        fprintf(stderr, "error: %s\n", err);
        return 1;
    }
    int rc = 0;
    for (int i = 2; i < argc; i++) {
        if (nm_pipeline_submit(p, &(nm_pipeline_input){.audio_path = argv[i]}, NULL, err, sizeof err) != NM_OK) {
            fprintf(stderr, "error: %s\n", err);
            rc = 1;
            continue;
        }
        nm_pipeline_event ev = {0};
        while (nm_pipeline_read(p, -1, &ev) == NM_OK && ev.kind != NM_PIPELINE_DONE)
            if (ev.kind == NM_PIPELINE_TRANSCRIPT) // t0, t1: 10 ms units
                printf("[%7.2f --> %7.2f] %s\n", ev.t0 / 100.0, ev.t1 / 100.0, ev.text);
        if (ev.status != NM_OK) fprintf(stderr, "error: %s: %s\n", argv[i], ev.text), rc = 1;
    }
    nm_pipeline_free(p);
    return rc;
}
