// nm-genmmproj: writes a small random-weight mmproj (CLIP/SigLIP ViT +
// projector) in llama.cpp's clip GGUF layout, and optionally a random planar
// input image. Used to compare our vision encoder with llama.cpp's and with
// tools/vision_ref/clip_ref.py (docs/correctness.md, docs/mmproj.md).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "genmmproj.h"
#include "quant/quant.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: nm-genmmproj -o OUT.gguf [--proj mlp|idefics3|qwen2vl_merger] [options]\n"
            "  --proj P           projector: mlp (LLaVA, default), idefics3 (SmolVLM) or qwen2vl_merger\n"
            "                     (Qwen2-VL: patch 14, two patch kernels, post-LN, 2x2 merger)\n"
            "  --type T           matmul weight type: f32 (default) f16 bf16 q8_0 q4_0 q4_1 q5_0 q5_1 q4_K q5_K q6_K\n"
            "  --seed N           random seed (default 1)\n"
            "  --image-size N     input side (default 64)\n"
            "  --patch-size N     patch side (default 16 for mlp, 8 for idefics3)\n"
            "  --n-embd N         ViT width (default 128)\n"
            "  --n-ff N           ViT FFN width (default 256)\n"
            "  --n-head N         attention heads (default 4)\n"
            "  --n-layer N        layers in the file (default 3; mlp runs n-layer - 1)\n"
            "  --n-out N          projector output width, the LLM's n_embd (default 576)\n"
            "  --scale-factor N   idefics3 pixel-shuffle factor (default 2)\n"
            "  --preproc-image-size N  idefics3 longest edge (clip.vision.preproc_image_size; default\n"
            "                     the image size; -1 writes no key, as old files)\n"
            "  --class-embd 0|1   class token (default 1 for mlp, 0 for idefics3)\n"
            "  --patch-bias 0|1   patch embedding bias (default 0 for mlp, 1 for idefics3)\n"
            "  --pre-ln 0|1       pre-layernorm (default 1 for mlp, 0 for idefics3)\n"
            "  --post-ln 0|1      post-layernorm (default 0 for mlp, 1 for idefics3)\n"
            "  --gelu 0|1         clip.use_gelu: tanh GELU (1) or quick GELU (0) in the ViT FFN\n"
            "                     (default 0 for mlp, 1 for idefics3)\n"
            "  --legacy-ffn       name fc1 ffn_down and fc2 ffn_up, as old LLaVA converters did\n"
            "  --f16-embd         patch kernel and position table in f16, as the legacy LLaVA converter wrote them\n"
            "  --eps X            layer-norm epsilon (default 1e-5 for mlp, 1e-6 for idefics3)\n"
            "  --pinpoints W,H,.. anyres resolutions (clip.vision.image_grid_pinpoints, LLaVA-1.6 style), e.g.\n"
            "                     64,128,128,64,128,128 for --image-size 64\n"
            "  --input FILE       also write a random planar normalized image (3 x S x S f32) from --seed\n"
            "  -h, --help         this help\n");
}

static int parse_bool(const char *v, bool *out) {
    if (!strcmp(v, "1") || !strcmp(v, "on") || !strcmp(v, "true")) *out = true;
    else if (!strcmp(v, "0") || !strcmp(v, "off") || !strcmp(v, "false")) *out = false;
    else return 1;
    return 0;
}

static int parse_int(const char *v, int32_t *out) {
    char *end;
    long x = strtol(v, &end, 10);
    if (*v == '\0' || *end != '\0' || x < -1000000000L || x > 1000000000L) return 1;
    *out = (int32_t)x;
    return 0;
}

int main(int argc, char **argv) {
    // The projector decides the defaults, so find it first.
    const char *proj = "mlp";
    for (int i = 1; i + 1 < argc; i++)
        if (!strcmp(argv[i], "--proj")) proj = argv[i + 1];
    nm_genmmproj_params p = nm_genmmproj_default_params(proj);
    const char *out = NULL, *input = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--legacy-ffn")) {
            p.legacy_ffn_names = true;
            continue;
        }
        if (!strcmp(a, "--f16-embd")) {
            p.f16_embd = true;
            continue;
        }
        const char *v = i + 1 < argc ? argv[++i] : NULL;
        if (!v) {
            fprintf(stderr, "nm-genmmproj: %s needs a value\n", a);
            usage(stderr);
            return 2;
        }
        int bad = 0;
        if (!strcmp(a, "-o")) out = v;
        else if (!strcmp(a, "--proj")) p.proj = v;
        else if (!strcmp(a, "--input")) input = v;
        else if (!strcmp(a, "--seed")) p.seed = strtoull(v, NULL, 10);
        else if (!strcmp(a, "--image-size")) bad = parse_int(v, &p.image_size);
        else if (!strcmp(a, "--patch-size")) bad = parse_int(v, &p.patch_size);
        else if (!strcmp(a, "--n-embd")) bad = parse_int(v, &p.n_embd);
        else if (!strcmp(a, "--n-ff")) bad = parse_int(v, &p.n_ff);
        else if (!strcmp(a, "--n-head")) bad = parse_int(v, &p.n_head);
        else if (!strcmp(a, "--n-layer")) bad = parse_int(v, &p.n_layer);
        else if (!strcmp(a, "--n-out")) bad = parse_int(v, &p.n_out_embd);
        else if (!strcmp(a, "--scale-factor")) bad = parse_int(v, &p.scale_factor);
        else if (!strcmp(a, "--preproc-image-size")) {
            bad = parse_int(v, &p.preproc_image_size) || p.preproc_image_size < -1 || p.preproc_image_size > 1 << 16;
        }
        else if (!strcmp(a, "--class-embd")) bad = parse_bool(v, &p.class_embd);
        else if (!strcmp(a, "--patch-bias")) bad = parse_bool(v, &p.patch_bias);
        else if (!strcmp(a, "--pre-ln")) bad = parse_bool(v, &p.pre_ln);
        else if (!strcmp(a, "--post-ln")) bad = parse_bool(v, &p.post_ln);
        else if (!strcmp(a, "--gelu")) bad = parse_bool(v, &p.use_gelu);
        else if (!strcmp(a, "--eps")) p.eps = strtof(v, NULL);
        else if (!strcmp(a, "--pinpoints")) {
            int32_t vals[128];
            int n = 0;
            char *end = (char *)v;
            while (*end && n < 128) {
                long x = strtol(end, &end, 10);
                if (x <= 0 || x > 1 << 20 || (*end && *end != ',')) break;
                vals[n++] = (int32_t)x;
                if (*end == ',') end++;
            }
            bad = *end || n == 0 || n % 2;
            p.n_pinpoints = n / 2;
            for (int k = 0; k < n; k++) p.pinpoints[k / 2][k % 2] = vals[k];
        }
        else if (!strcmp(a, "--type")) {
            uint32_t t;
            for (t = 0; t < NM_TYPE_COUNT; t++) {
                const nm_type_traits *tr = nm_type_traits_get(t);
                if (tr && nm_genmmproj_type_ok(t) && !strcmp(tr->name, v)) break;
            }
            if (t == NM_TYPE_COUNT) {
                fprintf(stderr, "nm-genmmproj: unknown or unsupported type '%s'\n", v);
                return 2;
            }
            p.wtype = t;
        } else {
            fprintf(stderr, "nm-genmmproj: unknown option %s\n", a);
            usage(stderr);
            return 2;
        }
        if (bad) {
            fprintf(stderr, "nm-genmmproj: bad value '%s' for %s\n", v, a);
            return 2;
        }
    }
    if (!out) {
        usage(stderr);
        return 2;
    }
    char err[256];
    if (nm_genmmproj_write(out, &p, err, sizeof err) != NM_OK) {
        fprintf(stderr, "nm-genmmproj: %s\n", err);
        return 1;
    }
    printf("nm-genmmproj: wrote %s (%s, %dx%d image, patch %d, %d layers, d %d, ff %d, out %d, %s)\n", out, p.proj,
           p.image_size, p.image_size, p.patch_size, p.n_layer, p.n_embd, p.n_ff, p.n_out_embd,
           nm_type_traits_get(p.wtype)->name);
    if (input) {
        if (nm_genmmproj_write_input(input, p.image_size, p.seed, err, sizeof err) != NM_OK) {
            fprintf(stderr, "nm-genmmproj: %s\n", err);
            return 1;
        }
        printf("nm-genmmproj: wrote %s (3 x %d x %d f32, planar)\n", input, p.image_size, p.image_size);
    }
    return 0;
}
