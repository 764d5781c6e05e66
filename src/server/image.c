// The server's images in chat messages (a vision brick). OpenAI's image_url parts:
// data: URLs with base64 (decoded on the request's thread), files under
// --image-dir (read there), http(s) URLs refused (the server fetches
// nothing). The bytes go with the request into the pipeline (gen.c),
// whose vision brick encodes each into the decoder's ring, in order with the
// text around it.
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/fail.h"
#include "server/server_impl.h"

nm_status serve_vision_start(server *S, char *err, size_t err_size) {
    if (!S->has_vision)
        return S->image_dir ? nm_fail(NM_ERR_INVALID_ARG, err, err_size, "server: an image directory needs a vision brick")
                            : NM_OK;
    if (S->image_dir) {
        struct stat st;
        S->image_dir_real = realpath(S->image_dir, NULL);
        if (!S->image_dir_real || stat(S->image_dir_real, &st) != 0 || !S_ISDIR(st.st_mode))
            return nm_fail(NM_ERR_IO, err, err_size, "server: image directory '%s': %s", S->image_dir,
                           S->image_dir_real ? "not a directory" : strerror(errno));
    }
    snprintf(S->vision_params, sizeof S->vision_params, "{\"max_pixels\":%lld}", (long long)S->image_max_pixels);
    return NM_OK;
}

void serve_vision_stop(server *S) {
    free(S->image_dir_real);
    S->image_dir_real = NULL;
}

// Base64 (RFC 4648, padding optional, line breaks and spaces skipped) into out.
static bool b64_decode(const char *s, size_t n, uint8_t *out, size_t cap, size_t *len, char *err, size_t es) {
    uint32_t acc = 0;
    int bits = 0;
    size_t o = 0, pad = 0;
    for (size_t i = 0; i < n; i++) {
        const unsigned char ch = (unsigned char)s[i];
        int v;
        if (ch >= 'A' && ch <= 'Z') v = ch - 'A';
        else if (ch >= 'a' && ch <= 'z') v = ch - 'a' + 26;
        else if (ch >= '0' && ch <= '9') v = ch - '0' + 52;
        else if (ch == '+') v = 62;
        else if (ch == '/') v = 63;
        else if (ch == '=') {
            pad++;
            continue;
        } else if (ch == '\r' || ch == '\n' || ch == ' ' || ch == '\t') {
            continue;
        } else {
            snprintf(err, es, "the image's base64 has a byte 0x%02x at offset %zu that is not base64", ch, i);
            return false;
        }
        if (pad) {
            snprintf(err, es, "the image's base64 goes on after its '=' padding (offset %zu)", i);
            return false;
        }
        acc = acc << 6 | (uint32_t)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            if (o == cap) {
                snprintf(err, es, "the image is over %zu bytes (3/4 of --max-body)", cap);
                return false;
            }
            out[o++] = (uint8_t)(acc >> bits);
        }
    }
    if (bits >= 6 || pad > 2) {
        snprintf(err, es, "the image's base64 is cut short (its length is not a whole number of bytes)");
        return false;
    }
    *len = o;
    return true;
}

// A regular file, read whole into *out (malloc'd; src/io/infile.c: a FIFO put there cannot hang the request).
// name: the file as the messages call it, its path under --image-dir (a client is not told the host's paths).
static nm_status read_image_file(const char *path, const char *name, size_t cap, char **out, size_t *len, char *err,
                                 size_t es) {
    char why[PATH_MAX + 256];
    const nm_status st = nm_infile_read(path, cap, 0, out, len, why, sizeof why);
    if (st == NM_ERR_RANGE)
        return nm_fail(st, err, es, "image file '%s' is over %zu bytes, the largest taken (3/4 of --max-body)", name, cap);
    if (st == NM_ERR_NOMEM) return nm_fail(st, err, es, "out of memory for image file '%s'", name);
    if (st != NM_OK) { // the cause without the host's path, which starts the message
        const size_t pl = strlen(path);
        const char *cause = !strncmp(why, path, pl) && !strncmp(why + pl, ": ", 2) ? why + pl + 2 : "cannot read it";
        return nm_fail(st, err, es, "image file '%s': %s", name, cause);
    }
    if (*len == 0) {
        free(*out);
        *out = NULL;
        return nm_fail(NM_ERR_FORMAT, err, es, "image file '%s' is empty", name);
    }
    return NM_OK;
}

nm_status serve_image_bytes(server *S, const serve_image *img, void **bytes, size_t *n, char *err, size_t err_size) {
    *bytes = NULL;
    *n = 0;
    if (!img->b64) {
        char *data = NULL;
        const nm_status st = read_image_file(img->path, img->path + strlen(S->image_dir_real) + 1,
                                             (size_t)S->body_max / 4 * 3 + 4, &data, n, err, err_size); // (3/4 of --max-body)
        *bytes = data;
        return st;
    }
    const size_t cap = img->b64_len / 4 * 3 + 3; // (what the base64 can hold)
    if (!(*bytes = malloc(cap))) return nm_fail(NM_ERR_NOMEM, err, err_size, "out of memory for the image");
    nm_status st = b64_decode(img->b64, img->b64_len, *bytes, cap, n, err, err_size) ? NM_OK : NM_ERR_FORMAT;
    if (st == NM_OK && *n == 0) st = nm_fail(NM_ERR_FORMAT, err, err_size, "the image is empty");
    if (st != NM_OK) {
        free(*bytes);
        *bytes = NULL;
    }
    return st;
}

int serve_vision_metrics(const server *S, char *buf, size_t size) {
    nm_pipeline_brick_report r;
    if (!S->P || nm_pipeline_brick_stats(S->P, NM_BRICK_VISION, &r) != NM_OK) return 0;
    int n = snprintf(buf, size,
                     "# TYPE nanomind_images_total counter\nnanomind_images_total %llu\n"
                     "# HELP nanomind_image_seconds_total Reading, preprocessing and encoding the images.\n"
                     "# TYPE nanomind_image_seconds_total counter\nnanomind_image_seconds_total %.6f\n",
                     (unsigned long long)r.s.n_images, r.s.t_busy);
    return n < 0 ? 0 : n >= (int)size ? (int)size - 1 : n;
}
