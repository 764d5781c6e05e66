// The server left out (-DNM_WITH_SERVER=OFF, so no civetweb; off.h): it does
// not start, and says which option brings it.
#include "nanomind.h"
#include "off/off.h"

// The same defaults as src/server/server.c: a caller's parameters build in every build.
nm_server_params nm_server_default_params(void) {
    return (nm_server_params){.host = "127.0.0.1", .port = 8080, .parallel = 1, .queue = 16, .idle_timeout_s = 10,
                              .body_timeout_s = 60, .body_max = 8 << 20, .image_max_pixels = 4096 * 4096,
                              .audio_max_s = 1800, .speech_max_chars = 4096, .idle_w = 1, .active_w = 1};
}

nm_status nm_server_start(const nm_server_params *p, nm_server **out, char *err, size_t err_size) {
    (void)p;
    if (out) *out = NULL;
    return nm_off_fail(err, err_size, "the server", "NM_WITH_SERVER");
}

void nm_server_stop(nm_server *s, int32_t timeout_s) { (void)s, (void)timeout_s; }

int32_t nm_server_port(const nm_server *s) {
    (void)s;
    return 0;
}
