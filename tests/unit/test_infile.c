// Input files (src/io/infile.c): no hang on a FIFO, no read past the cap, stdin only when taken.
#include "nmtest.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "io/infile.h"

static char dir[] = "/tmp/nm_infile_XXXXXX";

static const char *path_of(const char *name) {
    static char p[256];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return p;
}

static void write_file(const char *name, const char *text) {
    FILE *f = fopen(path_of(name), "wb");
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

NM_TEST(regular_file_read_whole) {
    write_file("a.txt", "hello");
    char *d = NULL, err[256];
    size_t n = 0;
    NM_CHECK(nm_infile_read(path_of("a.txt"), 5, 0, &d, &n, err, sizeof err) == NM_OK);
    NM_CHECK(n == 5 && d && !strcmp(d, "hello"));
    free(d);
    char buf[5];
    NM_CHECK(nm_infile_read_into(path_of("a.txt"), 0, buf, sizeof buf, &n, err, sizeof err) == NM_OK && n == 5);
}

// A FIFO with no writer: refused at once where a file is needed (the open would block without O_NONBLOCK),
// an empty stream where streams are taken. alarm() turns a hang into a failure.
NM_TEST(fifo_refused_never_waited_on) {
    const char *p = path_of("in.fifo");
    NM_CHECK(mkfifo(p, 0600) == 0);
    alarm(10);
    char *d = NULL, err[256] = "";
    size_t n = 1;
    NM_CHECK(nm_infile_read(p, 100, 0, &d, &n, err, sizeof err) == NM_ERR_IO);
    NM_CHECK(strstr(err, "in.fifo: not a regular file (a FIFO)") != NULL);
    FILE *f = NULL;
    NM_CHECK(nm_infile_open(p, 100, NM_INFILE_STDIN, &f, NULL, err, sizeof err) == NM_ERR_IO && !f);
    char buf[8];
    NM_CHECK(nm_infile_read_into(p, 0, buf, sizeof buf, &n, err, sizeof err) == NM_ERR_IO);
    NM_CHECK(nm_infile_read(p, 100, NM_INFILE_STREAM, &d, &n, err, sizeof err) == NM_OK && n == 0);
    free(d);
    alarm(0);
}

NM_TEST(folder_and_device_refused) {
    char *d = NULL, err[256] = "";
    size_t n;
    NM_CHECK(nm_infile_read(dir, 100, NM_INFILE_STREAM, &d, &n, err, sizeof err) == NM_ERR_IO);
    NM_CHECK(strstr(err, "is a directory") != NULL);
    NM_CHECK(nm_infile_read("/dev/zero", 100, 0, &d, &n, err, sizeof err) == NM_ERR_IO);
    NM_CHECK(strstr(err, "/dev/zero: not a regular file (a character device)") != NULL);
    NM_CHECK(nm_infile_read("/nonexistent/x", 100, 0, &d, &n, err, sizeof err) == NM_ERR_IO);
    NM_CHECK(strstr(err, "/nonexistent/x: cannot open: No such file or directory") != NULL);
}

// Over the cap: a regular file from its size (a sparse 100 GB file costs nothing), a stream once cap + 1
// bytes have come (/dev/zero as a stream ends at once).
NM_TEST(cap_checked_before_reading) {
    const char *p = path_of("sparse");
    int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    NM_CHECK(fd >= 0 && ftruncate(fd, 100ll << 30) == 0);
    close(fd);
    char *d = NULL, err[256] = "";
    size_t n;
    NM_CHECK(nm_infile_read(p, 1 << 20, 0, &d, &n, err, sizeof err) == NM_ERR_RANGE && !d);
    NM_CHECK(strstr(err, "sparse: 107374182400 bytes, over the limit of 1048576 bytes") != NULL);
    unlink(p);
    NM_CHECK(nm_infile_read("/dev/zero", 1 << 20, NM_INFILE_STREAM, &d, &n, err, sizeof err) == NM_ERR_RANGE && !d);
    NM_CHECK(strstr(err, "/dev/zero: more than 1048576 bytes, the limit") != NULL);
    write_file("six", "123456");
    char buf[5];
    NM_CHECK(nm_infile_read_into(path_of("six"), 0, buf, sizeof buf, &n, err, sizeof err) == NM_ERR_RANGE);
    NM_CHECK(nm_infile_read(path_of("six"), 6, 0, &d, &n, err, sizeof err) == NM_OK && n == 6);
    free(d);
    NM_CHECK(nm_infile_read(path_of("six"), 5, 0, &d, &n, err, sizeof err) == NM_ERR_RANGE);
}

// Our stdin (a pipe here): "-" and /dev/stdin with NM_INFILE_STDIN, read whole however it comes.
NM_TEST(stdin_read_whole_when_taken) {
    for (int k = 0; k < 2; k++) {
        int pfd[2];
        NM_CHECK(pipe(pfd) == 0);
        pid_t pid = fork();
        if (pid == 0) { // 200000 bytes in small writes
            close(pfd[0]);
            char b[1000];
            memset(b, 'x', sizeof b);
            for (int i = 0; i < 200; i++)
                if (write(pfd[1], b, sizeof b) != (ssize_t)sizeof b) _exit(1);
            _exit(0);
        }
        close(pfd[1]);
        const int saved = dup(0);
        dup2(pfd[0], 0);
        close(pfd[0]);
        char *d = NULL, err[256] = "";
        size_t n = 0;
        const char *p = k ? "/dev/stdin" : "-";
        NM_CHECK(nm_infile_read(p, 0, 0, &d, &n, err, sizeof err) == NM_ERR_IO); // not taken: refused
        NM_CHECK(nm_infile_read(p, 1 << 20, NM_INFILE_STDIN, &d, &n, err, sizeof err) == NM_OK);
        NM_CHECK(n == 200000 && d && d[0] == 'x' && d[199999] == 'x');
        free(d);
        dup2(saved, 0);
        close(saved);
        waitpid(pid, NULL, 0);
    }
}

__attribute__((constructor(200))) static void setup(void) {
    if (!mkdtemp(dir)) perror("mkdtemp");
}
__attribute__((destructor)) static void cleanup(void) {
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd)) {}
}

NM_TEST_MAIN()
