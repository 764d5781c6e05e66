// nm-requant: rewrites a GGUF model with its matrices in another type
// (dequantize, then quantize with the reference quantizer; 1-D tensors such as
// norms are copied unchanged). All metadata is copied byte for byte.
//   nm-requant --type f32 IN.gguf OUT.gguf
// Used to compare with llama.cpp on real weights without 8-bit activation
// rounding in the way (docs/correctness.md).
#include <stdio.h>
#include <string.h>

#include "genmodel.h"
#include "quant/quant.h"

int main(int argc, char **argv) {
    if (argc != 5 || strcmp(argv[1], "--type")) {
        fprintf(stderr, "usage: nm-requant --type TYPE IN.gguf OUT.gguf   (TYPE: f32, f16, q8_0, q4_K, ...)\n");
        return 2;
    }
    for (uint32_t t = 0; t < NM_TYPE_COUNT; t++) {
        const nm_type_traits *tr = nm_type_traits_get(t);
        if (tr && tr->supported && !strcmp(tr->name, argv[2])) return nm_requant_write(argv[3], argv[4], t);
    }
    fprintf(stderr, "nm-requant: unknown type '%s'\n", argv[2]);
    return 2;
}
