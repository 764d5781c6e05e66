// nanomind serve: images in chat messages (--mmproj). OpenAI's image_url parts:
// data: URLs with base64 (decoded straight into the vision brick's input slot),
// files under --image-dir (read into it), http(s) URLs refused (the server
// fetches nothing). The vision brick runs for the request while it holds the
// decoder's turn (on a thread of its own: see serve_image_send) and writes the
// image's embeddings into the decoder's ring, in order with the text around it.
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

#include "serve.h"

bool serve_vision_start(server *S) {
    if (!S->mmproj) {
        if (S->image_dir || S->mmproj_device || S->o.mmproj_cores || S->o.image_min_tokens || S->o.image_max_tokens) {
            fprintf(stderr, "error: %s needs --mmproj (the vision encoder)\n",
                    S->image_dir ? "--image-dir" : S->mmproj_device ? "--mmproj-device" : S->o.mmproj_cores ? "--mmproj-cores"
                    : S->o.image_min_tokens ? "--image-min-tokens" : "--image-max-tokens");
            return false;
        }
        return true;
    }
    if (S->image_dir) {
        struct stat st;
        S->image_dir_real = realpath(S->image_dir, NULL);
        if (!S->image_dir_real || stat(S->image_dir_real, &st) != 0 || !S_ISDIR(st.st_mode)) {
            fprintf(stderr, "error: --image-dir '%s': %s\n", S->image_dir,
                    S->image_dir_real ? "not a directory" : strerror(errno));
            return false;
        }
    }
    if (!cli_vision_load(&S->o, S->mmproj, S->mmproj_device, S->llm, S->ledger, &S->vision)) return false;
    // two slots: the request's parameters, then the image file (a data: URL's bytes are at most 3/4 of the
    // body it came in; a file under --image-dir may be as large)
    const size_t cap = (size_t)S->body_max / 4 * 3 + 4;
    char err[512];
    const nm_status st = nm_tabm_create(NULL, 2, cap, &S->img, err, sizeof err);
    if (st != NM_OK) {
        fprintf(stderr, "error: cannot create the vision brick's ring: %s: %s\n", nm_status_str(st), err);
        return false;
    }
    return true;
}

void serve_vision_stop(server *S) {
    if (S->img) nm_tabm_shutdown(S->img);
    nm_brick_free(S->vision);
    nm_tabm_free(S->img);
    free(S->image_dir_real);
    S->vision = NULL;
    S->img = NULL;
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

// A regular file into out (src/io/infile.c: a FIFO put there cannot hang the request). name: the file as the
// messages call it, its path under --image-dir (a client is not told the host's paths).
static bool read_image_file(const char *path, const char *name, uint8_t *out, size_t cap, size_t *len, char *err,
                            size_t es) {
    char why[PATH_MAX + 256];
    size_t n = 0;
    const nm_status st = nm_infile_read_into(path, 0, out, cap, &n, why, sizeof why);
    if (st == NM_ERR_RANGE) {
        snprintf(err, es, "image file '%s' is over %zu bytes, the largest taken (3/4 of --max-body)", name, cap);
        return false;
    }
    if (st != NM_OK) { // the cause without the host's path, which starts the message
        const size_t pl = strlen(path);
        const char *cause = !strncmp(why, path, pl) && !strncmp(why + pl, ": ", 2) ? why + pl + 2 : "cannot read it";
        snprintf(err, es, "image file '%s': %s", name, cause);
        return false;
    }
    if (n == 0) {
        snprintf(err, es, "image file '%s' is empty", name);
        return false;
    }
    *len = n;
    return true;
}

static bool image_send(server *S, const serve_image *img, uint64_t user, uint64_t id, int64_t *rows, bool *bad,
                       char *err, size_t err_size) {
    *bad = false;
    *rows = 0;
    nm_tabm_slot sl;
    if (nm_tabm_acquire_write(S->img, 0, -1, &sl) != NM_OK) {
        snprintf(err, err_size, "the vision brick is not running");
        return false;
    }
    // the request's parameters first: the pixel limit (--max-image-pixels)
    const int pn = snprintf(sl.data, sl.capacity, "{\"max_pixels\":%lld}", (long long)S->image_max_pixels);
    *sl.meta = (nm_tabm_meta){.kind = NM_TABM_PARAMS, .ndim = 1, .shape = {pn}, .size = (uint64_t)pn,
                              .user = NM_BRICK_MORE, .request = id};
    if (nm_tabm_publish(S->img, &sl) != NM_OK) {
        nm_tabm_cancel(S->img, &sl);
        snprintf(err, err_size, "the vision brick's ring: %s", nm_tabm_last_error(S->img));
        return false;
    }
    if (nm_tabm_acquire_write(S->img, 0, -1, &sl) != NM_OK) {
        snprintf(err, err_size, "the vision brick is not running");
        return false;
    }
    size_t n = 0;
    const bool read = img->b64 ? b64_decode(img->b64, img->b64_len, sl.data, sl.capacity, &n, err, err_size)
                               : read_image_file(img->path, img->path + strlen(S->image_dir_real) + 1, sl.data,
                                                 sl.capacity, &n, err, err_size);
    // a bad image still goes, empty: the brick fails it and ends this part in the decoder's ring, in step
    *bad = !read;
    *sl.meta = (nm_tabm_meta){.kind = NM_TABM_IMAGE, .ndim = n ? 1 : 0, .shape = {(int64_t)n}, .size = n,
                              .user = user, .request = id};
    if (nm_tabm_publish(S->img, &sl) != NM_OK) {
        nm_tabm_cancel(S->img, &sl);
        snprintf(err, err_size, "the vision brick's ring: %s", nm_tabm_last_error(S->img));
        *bad = false;
        return false;
    }
    // The encoder runs on a thread of its own: civetweb's connection threads have a 100 KB stack (Debian
    // builds it with USE_STACK_SIZE=102400), and the encoder's kernels outgrew it under ASan.
    const nm_brick_stats before = nm_brick_get_stats(S->vision);
    const double t0 = cli_now();
    cli_step R = {.b = S->vision, .in = S->img, .out = S->in, .st = NM_OK};
    pthread_t th;
    if (pthread_create(&th, NULL, cli_step_main, &R) != 0) {
        snprintf(err, err_size, "cannot start the vision encoder's thread");
        *bad = false;
        return false; // (the image slots stay: a server that cannot make a thread is going down)
    }
    pthread_join(th, NULL);
    const nm_status st = R.st;
    const nm_brick_stats after = nm_brick_get_stats(S->vision);
    pthread_mutex_lock(&S->lock);
    S->n_images++;
    S->image_seconds += cli_now() - t0;
    pthread_mutex_unlock(&S->lock);
    if (st != NM_OK) {
        snprintf(err, err_size, "the vision brick stopped: %s", nm_status_str(st));
        return false;
    }
    if (after.n_bad_requests != before.n_bad_requests || *bad) {
        if (!*bad) snprintf(err, err_size, "%s", nm_brick_last_error(S->vision)); // what is wrong with the image
        *bad = true;
        return false;
    }
    nm_vision_info vi;
    if (nm_brick_vision_info(S->vision, &vi)) *rows = (int64_t)(after.n_encoded - before.n_encoded) * vi.n_out;
    return true;
}

int serve_vision_metrics(const server *S, char *buf, size_t size) {
    if (!S->vision) return 0;
    int n = snprintf(buf, size,
                     "# TYPE nanomind_images_total counter\nnanomind_images_total %llu\n"
                     "# HELP nanomind_image_seconds_total Reading, preprocessing and encoding the images.\n"
                     "# TYPE nanomind_image_seconds_total counter\nnanomind_image_seconds_total %.6f\n",
                     (unsigned long long)S->n_images, S->image_seconds);
    return n < 0 ? 0 : n >= (int)size ? (int)size - 1 : n;
}

// One image at a time through the vision brick (requests decoded together may each have some).
bool serve_image_send(server *S, const serve_image *img, uint64_t user, uint64_t id, int64_t *rows, bool *bad,
                      char *err, size_t err_size) {
    pthread_mutex_lock(&S->vision_lock);
    const bool ok = image_send(S, img, user, id, rows, bad, err, err_size);
    pthread_mutex_unlock(&S->vision_lock);
    return ok;
}
