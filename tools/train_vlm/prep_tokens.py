#!/usr/bin/env python3
"""Tokenizes the scenes' questions and answers with nanomind's own tokenizer and chat
template (libnanomind through ctypes), for the training run on the GPU machine:

    prep_tokens.py LIB MODEL.gguf OUT.json

LIB: build/libnanomind.so. For each question, the prompt of a one-shot chat turn with the
image first (the way `nanomind run --chat --image` and llama.cpp's mtmd-cli build it: the
media marker before the question) is split at the marker into the text before the image
and the text after it, each tokenized as those tools do (specials parsed; the first chunk
with the model's BOS rule). Two template variants: with SmolLM2's default system turn (our
template, llama.cpp with --jinja) and without it (mtmd-cli's built-in chatml). An answer
is its tokens plus the end-of-turn token.
"""
import ctypes
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import scenes  # noqa: E402

MARKER = "<__media__>"


class Msg(ctypes.Structure):
    _fields_ = [("role", ctypes.c_char_p), ("content", ctypes.c_char_p)]


class ModelParams(ctypes.Structure):
    _fields_ = [("n_threads", ctypes.c_int32), ("no_mmap", ctypes.c_bool)]


def main(argv):
    if len(argv) != 3:
        sys.stderr.write(__doc__)
        return 2
    lib = ctypes.CDLL(argv[0])
    lib.nm_model_default_params.restype = ModelParams
    m = ctypes.c_void_p()
    err = ctypes.create_string_buffer(512)
    params = lib.nm_model_default_params()
    lib.nm_model_load.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p),
                                  ctypes.c_char_p, ctypes.c_size_t]
    st = lib.nm_model_load(argv[1].encode(), ctypes.byref(params), ctypes.byref(m), err, 512)
    if st != 0:
        sys.stderr.write("cannot load %s: %s\n" % (argv[1], err.value.decode()))
        return 1
    lib.nm_tokenize.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_int32),
                                ctypes.c_int32, ctypes.c_bool, ctypes.c_bool]
    lib.nm_chat_format.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.POINTER(Msg), ctypes.c_size_t,
                                   ctypes.c_bool, ctypes.c_char_p, ctypes.c_int32]

    def tok(text, add_special, parse_special):
        b = text.encode()
        out = (ctypes.c_int32 * 4096)()
        n = lib.nm_tokenize(m, b, len(b), out, 4096, add_special, parse_special)
        assert n >= 0, text
        return list(out[:n])

    def fmt(msgs):
        arr = (Msg * len(msgs))(*[Msg(r.encode(), c.encode()) for r, c in msgs])
        buf = ctypes.create_string_buffer(1 << 16)
        n = lib.nm_chat_format(m, None, arr, len(msgs), True, buf, 1 << 16)
        assert n > 0
        return buf.value.decode()

    im_end = tok("<|im_end|>", False, True)
    assert len(im_end) == 1
    out = {"model": os.path.basename(argv[1]), "marker": MARKER, "im_end": im_end[0], "questions": {},
           "answers": {}}
    for q in scenes.questions():
        variants = {}
        with_sys = fmt([("user", MARKER + q)])
        plain = "<|im_start|>user\n" + MARKER + q + "<|im_end|>\n<|im_start|>assistant\n"
        for name, text in (("system", with_sys), ("plain", plain)):
            pre, post = text.split(MARKER)
            variants[name] = {"text": text, "pre": tok(pre, True, True), "post": tok(post, False, True)}
        out["questions"][q] = variants
    for a in scenes.answers():
        out["answers"][a] = tok(a, False, False) + im_end
    with open(argv[2], "w") as f:
        json.dump(out, f, indent=0)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
