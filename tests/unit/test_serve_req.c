// The server's request parsers (src/server/req.c) on bodies with known
// outcomes: each refusal's HTTP code and the field it names, each accepted
// request's prompt, parameters, stop strings and images. (The fuzz target
// tests/fuzz/fuzz_serve_req.c checks the contracts on any bytes; the server
// test, the same parsers behind HTTP.)
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "nmtest.h"
#include "serve_req_chatml.h"

typedef struct gen_case {
    bool chat, vision;
    const char *body;
    int code;          // 0: accepted
    const char *param; // the field a refusal names (NULL: none)
    const char *msg;   // a part of its message
} gen_case;

static const gen_case GEN[] = {
    {false, false, "{\"prompt\":\"Hello\",\"max_tokens\":8,\"stop\":[\"\\n\",\"##\"],\"stream\":true}", 0, NULL, NULL},
    {false, false, "{\"prompt\":7}", 400, "prompt", "'prompt' must be a string"},
    {false, false, "{\"prompt\":\"x\",\"seed\":1.5}", 400, "seed", "an integer in [-1, 4.29497e+09]"},
    {false, false, "{\"prompt\":\"x\",\"temperature\":3}", 400, "temperature", "a number in [0, 2]"},
    {false, false, "{\"prompt\":\"x\",\"stream\":\"yes\"}", 400, "stream", "true or false"},
    {false, false, "{\"prompt\":\"x\",\"stop\":[\"\"]}", 400, "stop", "up to 16 strings of 1 to 256 bytes"},
    {false, false, "{\"prompt\":\"x\",\"n\":2}", 400, "n", "'n' must be 1"},
    {false, false, "{\"prompt\":\"x\",\"cache_prompt\":1}", 400, "cache_prompt", "true or false"},
    // fields that change the answer and are not served: a 400 naming each; at their defaults they pass
    {true, false, "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}]}",
     400, "tools", "'tools' asks for tool calls"},
    {true, false, "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"tool_choice\":\"required\"}", 400, "tool_choice", "tool calls"},
    {true, false, "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"response_format\":{\"type\":\"json_object\"}}",
     400, "response_format", "constrained output"},
    {true, false, "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{}}}",
     400, "response_format", "constrained output"},
    {true, false, "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"logprobs\":true}", 400, "logprobs", "log-probabilities"},
    {true, false, "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"top_logprobs\":3}", 400, "top_logprobs", "log-probabilities"},
    {false, false, "{\"prompt\":\"x\",\"logprobs\":2}", 400, "logprobs", "log-probabilities"},
    {false, false, "{\"prompt\":\"x\",\"echo\":true}", 400, "echo", "echoing"},
    {false, false, "{\"prompt\":\"x\",\"best_of\":3}", 400, "best_of", "best-of"},
    {false, false, "{\"prompt\":\"x\",\"suffix\":\"}\"}", 400, "suffix", "suffix"},
    {false, false, "{\"prompt\":\"x\",\"logit_bias\":{\"50256\":-100}}", 400, "logit_bias", "logit biases"},
    {false, false, "{\"prompt\":\"x\",\"grammar\":\"root ::= \\\"a\\\"\"}", 400, "grammar", "GBNF"},
    {false, false, "{\"prompt\":\"x\",\"mirostat\":2}", 400, "mirostat", "Mirostat"},
    {true, false, "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"modalities\":[\"text\",\"audio\"]}", 400, "modalities", "other than text"},
    {true, false, "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"tools\":[],\"tool_choice\":\"auto\",\"response_format\":{\"type\":\"text\"},"
                  "\"logprobs\":false,\"top_logprobs\":0,\"logit_bias\":{},\"modalities\":[\"text\"],\"functions\":null,\"typical_p\":1,"
                  "\"best_of\":1,\"user\":\"u1\",\"store\":false,\"metadata\":{\"a\":\"b\"},\"parallel_tool_calls\":true}", 0, NULL, NULL},
    {false, false, "{\"prompt\":\"x\",\"n_predict\":-3}", 400, "n_predict", "an integer in [-1"},
    {false, false, "{\"prompt\":\"x\",\"repeat_last_n\":\"all\"}", 400, "repeat_last_n", "an integer in [-1"},
    {true, false, "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]}", 0, NULL, NULL},
    {true, false, "{\"messages\":[]}", 400, "messages", "non-empty array"},
    {true, false, "{\"messages\":[{\"role\":\"tool\",\"content\":\"x\"}]}", 400, "messages", "message 0: 'role'"},
    {true, false, "{\"messages\":[{\"role\":\"user\",\"content\":5}]}", 400, "messages", "'content' must be a string"},
    {true, false, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"audio\"}]}]}", 400, "messages",
     "a part of type 'audio' is not served"},
    {true, false, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\",\"image_url\":\"data:image/png;base64,AA==\"}]}]}",
     400, "messages", "without --mmproj"},
    {true, true, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\",\"image_url\":{\"url\":\"https://a.b/c.png\"}}]}]}",
     400, "messages", "image URLs are not fetched"},
    {true, true, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\",\"image_url\":{\"url\":\"data:text/plain;base64,AA==\"}}]}]}",
     400, "messages", "must hold an image in base64"},
    {true, true, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\",\"image_url\":{\"url\":\"x.png\"}}]}]}",
     400, "messages", "local files are read only under --image-dir"},
    {true, true, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"<__media__>\"},"
                 "{\"type\":\"image_url\",\"image_url\":{\"url\":\"data:image/png;base64,AA==\"}}]}]}",
     400, "messages", "holds the media marker"},
};

NM_TEST(generation_requests_refused_or_parsed) {
    static const char *const server_stop[] = {"User:"};
    for (size_t i = 0; i < sizeof GEN / sizeof GEN[0]; i++) {
        const gen_case *c = &GEN[i];
        const serve_env env = {.vision = c->vision, .format = serve_req_chatml, .stop = server_stop, .n_stop = 1};
        serve_err e = {0};
        cJSON *req = serve_json_object(c->body, &e);
        NM_CHECK(req != NULL);
        serve_gen_req r;
        const bool ok = req && serve_gen_parse(&env, req, c->chat, &r, &e);
        if (c->code == 0) {
            NM_CHECK(ok && r.prompt && cJSON_IsObject(r.params));
        } else {
            const bool right = !ok && e.code == c->code && (c->param ? e.param && !strcmp(e.param, c->param) : !e.param) &&
                               strstr(e.msg, c->msg) != NULL;
            if (!right) fprintf(stderr, "  case %zu: %s -> %d %s: %s\n", i, c->body, e.code, e.param ? e.param : "-", e.msg);
            NM_CHECK(right);
        }
        if (ok) serve_gen_free(&r);
        cJSON_Delete(req);
    }
}

NM_TEST(generation_fields) {
    static const char *const server_stop[] = {"User:", "###"};
    serve_env env = {.format = serve_req_chatml, .stop = server_stop, .n_stop = 2, .system = "Be brief."};
    serve_err e;
    serve_gen_req r;
    // a completion: its parameters under the brick's names, its own stop strings (the server's not used)
    cJSON *req = serve_json_object("{\"prompt\":\"Once\",\"max_tokens\":12,\"temperature\":0.5,\"top_k\":40,"
                                   "\"stop\":\"END\",\"ignore_eos\":true,\"stream\":true,"
                                   "\"stream_options\":{\"include_usage\":true}}", &e);
    NM_CHECK(req && serve_gen_parse(&env, req, false, &r, &e));
    if (req && r.prompt) {
        NM_CHECK(!strcmp(r.prompt, "Once") && r.stream && r.usage_in_stream);
        NM_CHECK(cJSON_GetNumberValue(cJSON_GetObjectItem(r.params, "n_predict")) == 12 &&
                 cJSON_GetNumberValue(cJSON_GetObjectItem(r.params, "temperature")) == 0.5 &&
                 cJSON_GetNumberValue(cJSON_GetObjectItem(r.params, "top_k")) == 40 &&
                 cJSON_IsTrue(cJSON_GetObjectItem(r.params, "ignore_eos")));
        NM_CHECK(r.n_stop == 1 && !strcmp(r.stop[0], "END"));
        serve_gen_free(&r);
    }
    cJSON_Delete(req);
    // a chat: the server's system message first, its stop strings, the template's text
    req = serve_json_object("{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"Hi \"},"
                            "{\"type\":\"text\",\"text\":\"there\"}]}]}", &e);
    NM_CHECK(req && serve_gen_parse(&env, req, true, &r, &e));
    if (req && r.prompt) {
        NM_CHECK(!strcmp(r.prompt, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n"
                                   "<|im_start|>assistant\n"));
        NM_CHECK(r.n_stop == 2 && !strcmp(r.stop[1], "###") && !r.stream);
        serve_gen_free(&r);
    }
    cJSON_Delete(req);
    // images: a marker each where it was, the base64 payload pointing into the request
    env.vision = true;
    req = serve_json_object("{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"A \"},"
                            "{\"type\":\"image_url\",\"image_url\":{\"url\":\"data:image/png;base64,QUJD\"}},"
                            "{\"type\":\"text\",\"text\":\" and B \"},{\"type\":\"image_url\",\"image_url\":\"data:;base64,REVG\"}]}]}",
                            &e);
    NM_CHECK(req && serve_gen_parse(&env, req, true, &r, &e));
    if (req && r.prompt) {
        NM_CHECK(strstr(r.prompt, "A <__media__> and B <__media__>") != NULL && r.im.n == 2);
        NM_CHECK(r.im.v[0].b64_len == 4 && !memcmp(r.im.v[0].b64, "QUJD", 4) && !memcmp(r.im.v[1].b64, "REVG", 4));
        serve_gen_free(&r);
    }
    cJSON_Delete(req);
    // a file under --image-dir, and one out of it
    char dir[] = "/tmp/nm-serve-req-XXXXXX", path[64], real_dir[4096];
    NM_CHECK(mkdtemp(dir) != NULL && realpath(dir, real_dir) != NULL);
    snprintf(path, sizeof path, "%s/a.png", dir);
    FILE *f = fopen(path, "wb");
    NM_CHECK(f != NULL);
    if (f) fclose(f);
    env.image_dir_real = real_dir;
    req = serve_json_object("{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\",\"image_url\":\"a.png\"}]}]}", &e);
    NM_CHECK(req && serve_gen_parse(&env, req, true, &r, &e));
    if (req && r.prompt) {
        NM_CHECK(r.im.n == 1 && r.im.v[0].path && strstr(r.im.v[0].path, "/a.png") && !r.im.v[0].b64);
        serve_gen_free(&r);
    }
    cJSON_Delete(req);
    req = serve_json_object("{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\",\"image_url\":\"a.png\"},"
                            "{\"type\":\"image_url\",\"image_url\":\"../etc/passwd\"}]}]}", &e);
    NM_CHECK(req && !serve_gen_parse(&env, req, true, &r, &e) && e.code == 400 && strstr(e.msg, "message 0: image file"));
    cJSON_Delete(req);
    // one answer for a file out of the directory (there or not), a missing one in it and one that is no
    // file: not an oracle of which files exist on the host, and no host path but the client's own
    const char *names[] = {"/etc/passwd", "file:///etc/passwd", "/etc/nm-no-such-file", "nothere.png", ".", "../etc/passwd"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        char body[256], want[256];
        snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\","
                 "\"image_url\":\"%s\"}]}]}", names[i]);
        const char *p = strncmp(names[i], "file://", 7) ? names[i] : names[i] + 7;
        snprintf(want, sizeof want, "message 0: image file '%s': no such file under --image-dir", p);
        req = serve_json_object(body, &e);
        NM_CHECK(req && !serve_gen_parse(&env, req, true, &r, &e) && e.code == 400 && !strcmp(e.msg, want));
        if (strcmp(e.msg, want)) fprintf(stderr, "  %s: %s\n", names[i], e.msg);
        cJSON_Delete(req);
    }
    unlink(path);
    rmdir(dir);
}

static char *no_template(void *ctx, const nm_chat_msg *msgs, size_t n, const char *kwargs, nm_status *st) {
    (void)ctx, (void)msgs, (void)n, (void)kwargs;
    *st = NM_ERR_TEMPLATE;
    return NULL;
}

NM_TEST(bodies_and_templates_refused) {
    serve_err e;
    NM_CHECK(serve_json_object("[1]", &e) == NULL && e.code == 400 && strstr(e.msg, "not a JSON object"));
    NM_CHECK(serve_json_object("{\"a\":", &e) == NULL && e.code == 400);
    char deep[200] = "{\"a\":";
    for (int i = 0; i < 70; i++) strcat(deep, "[");
    NM_CHECK(serve_json_object(deep, &e) == NULL && e.code == 400 && strstr(e.msg, "deeper than 64 levels"));
    const serve_env env = {.format = no_template};
    cJSON *req = serve_json_object("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", &e);
    serve_gen_req r;
    NM_CHECK(req && !serve_gen_parse(&env, req, true, &r, &e) && e.code == 500 && strstr(e.msg, "--chat-template"));
    cJSON_Delete(req);
}

// chat_template_kwargs: the server's (--chat-template-kwargs) with a request's members over them, handed
// to the template; refused without the Jinja template, when not an object, or naming a reserved variable.
NM_TEST(chat_template_kwargs_merged_or_refused) {
    serve_env env = {.format = serve_req_chatml};
    static const struct { bool jinja; const char *server, *kw; int code; const char *want; } cs[] = {
        {true, NULL, NULL, 0, ""},
        {true, "{\"enable_thinking\":true,\"x\":1}", NULL, 0, "{\"enable_thinking\":true,\"x\":1}"},
        {true, "{\"enable_thinking\":true,\"x\":1}", "{\"enable_thinking\":false}", 0, "{\"enable_thinking\":false,\"x\":1}"},
        {true, NULL, "{\"enable_thinking\":false}", 0, "{\"enable_thinking\":false}"},
        {true, NULL, "{}", 0, ""},
        {false, NULL, "{\"enable_thinking\":false}", 400, "start it with --jinja"},
        {true, NULL, "[1]", 400, "must be an object"},
        {true, NULL, "{\"messages\":[]}", 400, "'messages' is the conversation's own"},
        {true, NULL, "{\"add_generation_prompt\":false}", 400, "'add_generation_prompt' is the conversation's own"},
    };
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
        env.jinja = cs[i].jinja, env.chat_kwargs = cs[i].server;
        char body[256];
        snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]%s%s}",
                 cs[i].kw ? ",\"chat_template_kwargs\":" : "", cs[i].kw ? cs[i].kw : "");
        serve_err e = {0};
        cJSON *req = serve_json_object(body, &e);
        serve_gen_req r;
        serve_req_last_kwargs[0] = '\0';
        const bool ok = req && serve_gen_parse(&env, req, true, &r, &e);
        const bool right = cs[i].code == 0 ? ok && !strcmp(serve_req_last_kwargs, cs[i].want)
                                           : !ok && e.code == cs[i].code && e.param &&
                                                 !strcmp(e.param, "chat_template_kwargs") && strstr(e.msg, cs[i].want);
        if (!right) fprintf(stderr, "  case %zu: %s -> %d %s / '%s'\n", i, body, e.code, e.msg, serve_req_last_kwargs);
        NM_CHECK(right);
        if (ok) serve_gen_free(&r);
        cJSON_Delete(req);
    }
}

NM_TEST(speech_requests) {
    const serve_env env = {.speech_max_chars = 10};
    static const struct { const char *body; const char *param; } bad[] = {
        {"{\"input\":\"\"}", "input"},
        {"{\"input\":\"eleven char\"}", "input"},
        {"{\"input\":\"hi\",\"voice\":\"\"}", "voice"},
        {"{\"input\":\"hi\",\"response_format\":\"aac\"}", "response_format"},
        {"{\"input\":\"hi\",\"response_format\":\"ogg\"}", "response_format"},
        {"{\"input\":\"hi\",\"response_format\":3}", "response_format"},
        {"{\"input\":\"hi\",\"speed\":5}", "speed"},
    };
    serve_err e;
    serve_speech_req sr;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cJSON *req = serve_json_object(bad[i].body, &e);
        NM_CHECK(req && !serve_speech_parse(&env, req, &sr, &e) && e.code == 400 && e.param && !strcmp(e.param, bad[i].param));
        cJSON_Delete(req);
    }
    cJSON *req = serve_json_object("{\"input\":\"héllo\",\"voice\":\"nova\",\"response_format\":\"pcm\",\"speed\":1.5}", &e);
    NM_CHECK(req && serve_speech_parse(&env, req, &sr, &e)); // 5 characters (6 bytes)
    if (req && sr.params) {
        NM_CHECK(sr.format == SERVE_PCM && !strcmp(sr.text, "héllo") &&
                 !strcmp(sr.params, "{\"voice\":\"en-us+f3\",\"speed\":1.5}"));
        free(sr.params);
    }
    cJSON_Delete(req);
    // the encoded formats, and WAV when none is named
    static const struct { const char *body; serve_audio_format f; nm_audio_container c; } fmts[] = {
        {"{\"input\":\"hi\",\"response_format\":\"mp3\"}", SERVE_ENCODED, NM_AUDIO_MP3},
        {"{\"input\":\"hi\",\"response_format\":\"opus\"}", SERVE_ENCODED, NM_AUDIO_OPUS},
        {"{\"input\":\"hi\",\"response_format\":\"flac\"}", SERVE_ENCODED, NM_AUDIO_FLAC},
        {"{\"input\":\"hi\",\"response_format\":\"wav\"}", SERVE_WAV, 0},
        {"{\"input\":\"hi\",\"response_format\":null}", SERVE_WAV, 0},
        {"{\"input\":\"hi\"}", SERVE_WAV, 0},
    };
    for (size_t i = 0; i < sizeof fmts / sizeof fmts[0]; i++) {
        req = serve_json_object(fmts[i].body, &e);
        NM_CHECK(req && serve_speech_parse(&env, req, &sr, &e) && sr.format == fmts[i].f &&
                 (sr.format != SERVE_ENCODED || sr.container == fmts[i].c));
        if (req) free(sr.params);
        cJSON_Delete(req);
    }
}

// Generated text goes into JSON as valid UTF-8: well-formed sequences of each
// length as they are; a stray continuation byte, a lead byte without its
// continuations, a sequence cut by the end, overlong forms, surrogates and
// code points past U+10FFFF each a U+FFFD per byte; cJSON then parses it back.
NM_TEST(generated_text_is_valid_utf8) {
    static const struct { const char *in, *want; } cases[] = {
        {"plain ascii", "plain ascii"},
        {"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80", "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"},
        {"a\x80" "b", "a\xef\xbf\xbd" "b"},
        {"\xc3" "x", "\xef\xbf\xbd" "x"},
        {"\xe2\x82", "\xef\xbf\xbd\xef\xbf\xbd"},
        {"\xc0\xaf", "\xef\xbf\xbd\xef\xbf\xbd"},
        {"\xe0\x80\xaf", "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"},
        {"\xed\xa0\x80", "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"},
        {"\xf4\x90\x80\x80", "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"},
        {"\xf0\x90\x80\x80", "\xf0\x90\x80\x80"},
        {"\xff\xfe", "\xef\xbf\xbd\xef\xbf\xbd"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char out[64] = {0};
        const size_t n = serve_utf8_clean(cases[i].in, strlen(cases[i].in), out);
        const bool ok = n == strlen(cases[i].want) && !memcmp(out, cases[i].want, n);
        if (!ok) fprintf(stderr, "  case %zu: got %zu bytes\n", i, n);
        NM_CHECK(ok);
    }
    // every byte value after every lead: the output always parses back as a JSON string
    char in[4], out[16], json[64];
    int bad = 0;
    for (int a = 0; a < 256; a++)
        for (int b = 0; b < 256; b++) {
            in[0] = (char)a, in[1] = (char)b, in[2] = (char)0x80, in[3] = 'z';
            const size_t n = serve_utf8_clean(in, 4, out);
            snprintf(json, sizeof json, "\"%.*s\"", (int)n, out);
            cJSON *back = (a == '"' || a == '\\' || b == '"' || b == '\\' || a < 0x20 || b < 0x20) ? NULL : cJSON_Parse(json);
            if (back && (!cJSON_IsString(back) || strlen(back->valuestring) != n)) bad++;
            for (size_t k = 0; k < n;) { // well-formed throughout
                const unsigned char c = (unsigned char)out[k];
                const size_t len = c < 0x80 ? 1 : c < 0xe0 ? 2 : c < 0xf0 ? 3 : 4;
                bad += c >= 0x80 && c < 0xc2;
                k += len;
            }
            cJSON_Delete(back);
        }
    NM_CHECK(bad == 0);
}

// nm_server_start refuses parameters out of range before it loads anything, naming them (the library's
// server: the command checks its flags itself), and a model it cannot load names the brick.
NM_TEST(server_params_refused) {
    nm_brick_params lp = nm_brick_default_params(NM_BRICK_LLM);
    lp.model = "/nonexistent/model.gguf";
    nm_server *s = (nm_server *)&lp; // (set to NULL by every failure)
    char err[512] = "";
    nm_server_params p = nm_server_default_params();
    NM_CHECK(nm_server_start(&p, &s, err, sizeof err) == NM_ERR_INVALID_ARG && !s && strstr(err, "no llm brick"));
    p.llm = &lp;
    const struct {
        int32_t parallel, queue, port, idle, audio;
        int64_t pixels, body;
    } bad[] = {{0, 16, 8080, 10, 60, 1, 4096}, {257, 16, 8080, 10, 60, 1, 4096}, {1, 4097, 8080, 10, 60, 1, 4096},
               {1, 16, 65536, 10, 60, 1, 4096},  {1, 16, 8080, 0, 60, 1, 4096},   {1, 16, 8080, 10, 0, 1, 4096},
               {1, 16, 8080, 10, 60, 0, 4096},   {1, 16, 8080, 10, 60, 1, 1023}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        nm_server_params q = p;
        q.parallel = bad[i].parallel, q.queue = bad[i].queue, q.port = bad[i].port, q.idle_timeout_s = bad[i].idle;
        q.audio_max_s = bad[i].audio, q.image_max_pixels = bad[i].pixels, q.body_max = bad[i].body;
        err[0] = '\0';
        NM_CHECK(nm_server_start(&q, &s, err, sizeof err) == NM_ERR_INVALID_ARG && !s && strstr(err, "out of range"));
    }
    nm_server_params k = p; // chat template kwargs: the Jinja template's only, a JSON object
    k.chat_template_kwargs = "{\"enable_thinking\": false}";
    NM_CHECK(nm_server_start(&k, &s, err, sizeof err) == NM_ERR_INVALID_ARG && !s && strstr(err, "need the Jinja"));
    k.jinja = true, k.chat_template_kwargs = "{\"enable_thinking\":";
    NM_CHECK(nm_server_start(&k, &s, err, sizeof err) == NM_ERR_INVALID_ARG && !s && strstr(err, "not a JSON object"));
    err[0] = '\0';
    NM_CHECK(nm_server_start(&p, &s, err, sizeof err) != NM_OK && !s && !strncmp(err, "llm: ", 5) &&
             strstr(err, "/nonexistent/model.gguf"));
    if (strncmp(err, "llm: ", 5)) fprintf(stderr, "  %s\n", err);
    nm_server_stop(NULL, 0);
}

NM_TEST_MAIN()
