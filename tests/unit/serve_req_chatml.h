// The chat formatter the tests of src/server/req.c give the parsers
// (serve_env.format): the built-in chatml template, no model needed; the
// template variables it was given kept in serve_req_last_kwargs ("" for none).
#ifndef NM_SERVE_REQ_CHATML_H
#define NM_SERVE_REQ_CHATML_H

#include <stdlib.h>

#include "bricks/tokenizer/chat.h"
#include "server/req.h"

#include <stdio.h>

static char serve_req_last_kwargs[512];

static char *serve_req_chatml(void *ctx, const nm_chat_msg *msgs, size_t n, const char *kwargs, nm_status *st) {
    (void)ctx;
    snprintf(serve_req_last_kwargs, sizeof serve_req_last_kwargs, "%s", kwargs ? kwargs : "");
    const nm_chat_tmpl t = nm_chat_from_name("chatml");
    int32_t need = nm_chat_apply(t, NULL, msgs, n, true, NULL, NULL, 0);
    *st = NM_ERR_NOMEM;
    if (need < 0) need = -need;
    char *buf = malloc((size_t)need + 1);
    if (buf && nm_chat_apply(t, NULL, msgs, n, true, NULL, buf, need + 1) < 0) {
        free(buf);
        buf = NULL;
    }
    if (buf) *st = NM_OK;
    return buf;
}

#endif
