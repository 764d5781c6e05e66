// nanomind info: metadata and tensor table of a GGUF file.
#include <stdio.h>
#include <string.h>

#include "cli.h"

int cmd_info(int argc, char **argv) {
    cli_opts o;
    const char *path = NULL;
    if (!cli_parse("info", CLI_MPATH, argc, argv, &o, &path)) return 2;
    if (o.version) {
        cli_print_version();
        return 0;
    }
    if (o.help) {
        printf("usage: nanomind info MODEL.gguf   (or -m MODEL.gguf)\n"
               "\n"
               "Prints the GGUF version, every metadata key (arrays abbreviated) and a table of\n"
               "the tensors (name, type, shape, bytes). A corrupt file is reported, not loaded.\n");
        return 0;
    }
    if (!path) path = o.model;
    if (!path) {
        fprintf(stderr, "error: nanomind info needs a GGUF file\n");
        return 2;
    }
    char err[512];
    nm_status st = nm_gguf_print_file(path, stdout, err, sizeof err);
    if (st != NM_OK) {
        fprintf(stderr, "error: %s: %s: %s\n", path, nm_status_str(st), err);
        return 1;
    }
    return 0;
}
