// Replays a fuzz corpus without libFuzzer: runs LLVMFuzzerTestOneInput on every
// file of the given directories (or files). Used by ctest, under sanitizers in CI.
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int run_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) { fprintf(stderr, "cannot open %s\n", path); return 1; }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *buf = malloc(n > 0 ? (size_t)n : 1);
    if (!buf || (n > 0 && fread(buf, 1, (size_t)n, f) != (size_t)n)) { fclose(f); free(buf); return 1; }
    fclose(f);
    LLVMFuzzerTestOneInput(buf, (size_t)n);
    free(buf);
    return 0;
}

int main(int argc, char **argv) {
    int passed = 0, failed = 0;
    for (int i = 1; i < argc; i++) {
        struct stat st;
        if (stat(argv[i], &st) != 0) { fprintf(stderr, "missing %s\n", argv[i]); failed++; continue; }
        if (!S_ISDIR(st.st_mode)) { if (run_file(argv[i])) failed++; else passed++; continue; }
        DIR *d = opendir(argv[i]);
        struct dirent *e;
        while (d && (e = readdir(d))) {
            if (e->d_name[0] == '.') continue;
            char p[4096];
            snprintf(p, sizeof p, "%s/%s", argv[i], e->d_name);
            if (run_file(p)) failed++; else passed++;
        }
        if (d) closedir(d);
    }
    // Every input that returns has not crashed, hung or tripped a sanitizer.
    printf("%d passed, %d failed\n", passed, failed);
    return failed || passed == 0;
}
