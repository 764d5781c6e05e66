// A body's deadline (--body-timeout, serve.h): the watchdog that shuts a slow
// body's socket for reading when its time is up.
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include "server/server_impl.h"

static double mono_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

// Whether a (getpeername/getsockname) is addr:port, addr as civetweb writes it (numeric).
static bool is_endpoint(const struct sockaddr_storage *a, const char *addr, int port) {
    if (a->ss_family == AF_INET) {
        const struct sockaddr_in *s = (const struct sockaddr_in *)a;
        struct in_addr want;
        return ntohs(s->sin_port) == port && (!addr || (inet_pton(AF_INET, addr, &want) == 1 &&
                                                         want.s_addr == s->sin_addr.s_addr));
    }
    if (a->ss_family == AF_INET6) {
        const struct sockaddr_in6 *s = (const struct sockaddr_in6 *)a;
        struct in6_addr want;
        struct in_addr want4; // an IPv4 peer on a dual-stack socket, written as IPv4
        if (ntohs(s->sin6_port) != port) return false;
        if (!addr) return true;
        if (inet_pton(AF_INET6, addr, &want) == 1) return !memcmp(&want, &s->sin6_addr, sizeof want);
        return inet_pton(AF_INET, addr, &want4) == 1 && IN6_IS_ADDR_V4MAPPED(&s->sin6_addr) &&
               !memcmp(&s->sin6_addr.s6_addr[12], &want4, 4);
    }
    return false;
}

// The request's socket: the one open file whose peer is the client's address and port and whose own port
// is the one it came in on; -1 if none or several are (civetweb 1.15 gives no local address, and on a host
// of several addresses one client port may reach two of them: no deadline then, rather than a wrong one).
int serve_conn_fd(struct mg_connection *c) {
    const struct mg_request_info *ri = mg_get_request_info(c);
    DIR *d = opendir("/proc/self/fd");
    if (!d) return -1;
    int found = -1, n_found = 0; // (civetweb gives no local address: two matches, and none is watched)
    for (struct dirent *e; n_found < 2 && (e = readdir(d));) {
        char *end;
        const long fd = strtol(e->d_name, &end, 10);
        struct stat st;
        if (*end || end == e->d_name || fd == dirfd(d) || fstat((int)fd, &st) || !S_ISSOCK(st.st_mode)) continue;
        struct sockaddr_storage peer, self;
        socklen_t lp = sizeof peer, ls = sizeof self;
        if (getpeername((int)fd, (struct sockaddr *)&peer, &lp) || getsockname((int)fd, (struct sockaddr *)&self, &ls))
            continue;
        if (is_endpoint(&peer, ri->remote_addr, ri->remote_port) && is_endpoint(&self, NULL, ri->server_port))
            found = (int)fd, n_found++;
    }
    closedir(d);
    return n_found == 1 ? found : -1;
}

bool serve_peer_closed(int fd) {
    char b;
    const ssize_t n = recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

static void *watchdog_main(void *arg) {
    serve_watchdog *w = arg;
    pthread_mutex_lock(&w->lock);
    while (!w->stop) {
        const double now = mono_now();
        double next = INFINITY;
        for (serve_watch *e = w->head; e; e = e->next) {
            if (e->fired) continue;
            if (e->deadline <= now) { // the blocked read returns 0; the handler sees fired (its entry is
                shutdown(e->fd, SHUT_RD); // listed until it ends the watch, so the descriptor is its socket)
                e->fired = true;
            } else if (e->deadline < next) {
                next = e->deadline;
            }
        }
        if (isinf(next)) {
            pthread_cond_wait(&w->cv, &w->lock);
        } else {
            struct timespec ts;
            ts.tv_sec = (time_t)next;
            ts.tv_nsec = (long)((next - (double)ts.tv_sec) * 1e9);
            pthread_cond_timedwait(&w->cv, &w->lock, &ts);
        }
    }
    pthread_mutex_unlock(&w->lock);
    return NULL;
}

bool serve_watchdog_start(serve_watchdog *w, int timeout_s) {
    memset(w, 0, sizeof *w);
    w->timeout_s = timeout_s;
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_mutex_init(&w->lock, NULL);
    pthread_cond_init(&w->cv, &ca);
    pthread_condattr_destroy(&ca);
    w->started = pthread_create(&w->thread, NULL, watchdog_main, w) == 0;
    return w->started;
}

void serve_watchdog_stop(serve_watchdog *w) {
    if (!w->started) return;
    pthread_mutex_lock(&w->lock);
    w->stop = true;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->lock);
    pthread_join(w->thread, NULL);
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->lock);
    w->started = false;
}

void serve_watch_begin(serve_watchdog *w, struct mg_connection *c, serve_watch *e) {
    memset(e, 0, sizeof *e);
    e->fd = w->started && w->timeout_s > 0 ? serve_conn_fd(c) : -1;
    if (e->fd < 0) return; // (no /proc, or no deadline asked: civetweb's per-read wait alone)
    e->deadline = mono_now() + w->timeout_s;
    pthread_mutex_lock(&w->lock);
    e->next = w->head;
    w->head = e;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->lock);
}

bool serve_watch_end(serve_watchdog *w, serve_watch *e) {
    if (e->fd < 0) return false;
    pthread_mutex_lock(&w->lock);
    for (serve_watch **p = &w->head; *p; p = &(*p)->next)
        if (*p == e) {
            *p = e->next;
            break;
        }
    const bool fired = e->fired;
    pthread_mutex_unlock(&w->lock);
    e->fd = -1;
    return fired;
}
