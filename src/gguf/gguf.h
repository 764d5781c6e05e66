// GGUF reader and writer (v2, v3).
// Spec: https://github.com/ggml-org/ggml/blob/master/docs/gguf.md
//
// The reader mmaps the file read-only. Every key, string and tensor descriptor
// points into the mapping: nothing is copied, and tensor data pointers stay
// valid until nm_gguf_close(). Every count, length, offset and size is checked
// against the file size and for overflow at open time, so accessors never need
// to re-validate. An opened nm_gguf is never modified: any number of threads
// may read it at once.
#ifndef NM_GGUF_H
#define NM_GGUF_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>
#include <stdio.h>

#include "nanomind.h"

#define NM_GGUF_MAGIC 0x46554747u // "GGUF" little-endian
#define NM_GGUF_DEFAULT_ALIGNMENT 32
#define NM_GGUF_MAX_DIMS 4

// Metadata value types, numbered as in the spec.
enum nm_gguf_vtype {
    NM_GGUF_UINT8 = 0,
    NM_GGUF_INT8 = 1,
    NM_GGUF_UINT16 = 2,
    NM_GGUF_INT16 = 3,
    NM_GGUF_UINT32 = 4,
    NM_GGUF_INT32 = 5,
    NM_GGUF_FLOAT32 = 6,
    NM_GGUF_BOOL = 7,
    NM_GGUF_STRING = 8,
    NM_GGUF_ARRAY = 9,
    NM_GGUF_UINT64 = 10,
    NM_GGUF_INT64 = 11,
    NM_GGUF_FLOAT64 = 12,
    NM_GGUF_VTYPE_COUNT
};

// A length-delimited string inside the mapping (NOT NUL-terminated).
typedef struct nm_str {
    const char *ptr;
    uint64_t len;
} nm_str;

typedef struct nm_gguf_kv {
    nm_str key;
    uint32_t type;       // enum nm_gguf_vtype
    uint32_t arr_type;   // element type when type == ARRAY
    uint64_t arr_n;      // element count when type == ARRAY
    const uint8_t *data; // the value (for ARRAY: the first element) in the mapping
} nm_gguf_kv;

typedef struct nm_gguf_tensor {
    nm_str name;
    uint32_t type;                 // enum nm_type (ggml numbering)
    uint32_t n_dims;
    int64_t ne[NM_GGUF_MAX_DIMS];  // ne[0] is the contiguous (row) dimension; unused dims are 1
    uint64_t offset;               // relative to the data section
    uint64_t nbytes;
    const void *data;              // in the mapping; valid until nm_gguf_close()
} nm_gguf_tensor;

typedef struct nm_gguf nm_gguf;

// Opens and validates `path`. On success *out owns the mapping; free it with
// nm_gguf_close(). On failure returns a negative status, *out is NULL, and
// `err` (if non-NULL) receives a message naming what is wrong.
nm_status nm_gguf_open(const char *path, nm_gguf **out, char *err, size_t err_size);
// Same, reading the whole file into memory it owns instead of mapping it
// (llama.cpp's --no-mmap: the weights become anonymous memory).
nm_status nm_gguf_open_read(const char *path, nm_gguf **out, char *err, size_t err_size);
// Same, over a caller-owned buffer (borrowed until close; used by the fuzzer).
nm_status nm_gguf_open_memory(const void *buf, size_t size, nm_gguf **out, char *err, size_t err_size);
void nm_gguf_close(nm_gguf *g); // NULL is a no-op

uint32_t nm_gguf_version(const nm_gguf *g);
uint64_t nm_gguf_alignment(const nm_gguf *g);
uint64_t nm_gguf_file_size(const nm_gguf *g);
uint64_t nm_gguf_data_offset(const nm_gguf *g);

int64_t nm_gguf_n_kv(const nm_gguf *g);
const nm_gguf_kv *nm_gguf_kv_at(const nm_gguf *g, int64_t i);
const nm_gguf_kv *nm_gguf_find(const nm_gguf *g, const char *key); // NULL if absent

int64_t nm_gguf_n_tensors(const nm_gguf *g);
const nm_gguf_tensor *nm_gguf_tensor_at(const nm_gguf *g, int64_t i);
const nm_gguf_tensor *nm_gguf_find_tensor(const nm_gguf *g, const char *name); // NULL if absent

// Typed getters: return false if the key is absent or has another type.
// Integer getters accept any integer type whose value fits.
bool nm_gguf_get_u32(const nm_gguf *g, const char *key, uint32_t *out);
bool nm_gguf_get_i64(const nm_gguf *g, const char *key, int64_t *out);
bool nm_gguf_get_f32(const nm_gguf *g, const char *key, float *out); // FLOAT32 or FLOAT64
bool nm_gguf_get_bool(const nm_gguf *g, const char *key, bool *out);
bool nm_gguf_get_str(const nm_gguf *g, const char *key, nm_str *out);
// Array of strings: fills out[0..n) (n = kv->arr_n). Returns false on type mismatch.
bool nm_gguf_arr_strings(const nm_gguf_kv *kv, nm_str *out, uint64_t n);
// Scalar element i of a numeric array, converted.
double nm_gguf_arr_num(const nm_gguf_kv *kv, uint64_t i);
size_t nm_gguf_vtype_size(uint32_t vtype); // 0 for STRING/ARRAY or unknown
const char *nm_gguf_vtype_name(uint32_t vtype);

// Compare an nm_str with a C string.
bool nm_str_eq(nm_str s, const char *c);

// Bytes taken by one value of `type` at p, which must lie in an opened (hence
// validated) file. For ARRAY, p points at the element type that starts the
// array (as the elements of an array of arrays do; kv->data of an ARRAY kv
// points past it, at the first element). 0 for an unknown type.
uint64_t nm_gguf_value_size(uint32_t type, const void *p);

// Prints the header, every kv (long strings and arrays abbreviated: type,
// count, first elements) and a tensor table (name, type, shape, bytes) to f.
// Used by `nanomind info MODEL`.
void nm_gguf_print_info(const nm_gguf *g, FILE *f);

// ---- writer ----------------------------------------------------------------
// Builds a GGUF v3 file in memory (metadata and tensor descriptors) and writes
// it with the tensor data, each tensor aligned to `alignment`.
typedef struct nm_gguf_writer nm_gguf_writer;

nm_gguf_writer *nm_gguf_writer_create(void); // NULL on OOM; free with _free
void nm_gguf_writer_free(nm_gguf_writer *w);  // NULL is a no-op
void nm_gguf_writer_set_version(nm_gguf_writer *w, uint32_t version); // 2 or 3 (default 3)
nm_status nm_gguf_writer_add_u32(nm_gguf_writer *w, const char *key, uint32_t v);
nm_status nm_gguf_writer_add_i32(nm_gguf_writer *w, const char *key, int32_t v);
nm_status nm_gguf_writer_add_u64(nm_gguf_writer *w, const char *key, uint64_t v);
nm_status nm_gguf_writer_add_f32(nm_gguf_writer *w, const char *key, float v);
nm_status nm_gguf_writer_add_bool(nm_gguf_writer *w, const char *key, bool v);
nm_status nm_gguf_writer_add_str(nm_gguf_writer *w, const char *key, const char *v);
// Array of scalars of type `vtype` (not STRING/ARRAY); `data` is copied.
nm_status nm_gguf_writer_add_arr(nm_gguf_writer *w, const char *key, uint32_t vtype,
                                 const void *data, uint64_t n);
nm_status nm_gguf_writer_add_arr_str(nm_gguf_writer *w, const char *key,
                                     const char *const *strs, uint64_t n);
// Raw value bytes already encoded in GGUF wire format (used for nested arrays
// and by tests that build odd files). `type` is the top-level value type.
nm_status nm_gguf_writer_add_raw(nm_gguf_writer *w, const char *key, uint32_t type,
                                 const void *bytes, size_t nbytes);
// Adds a tensor; ne[0..n_dims) as in nm_gguf_tensor. `data` (nbytes derived
// from type and shape) is borrowed until nm_gguf_writer_write returns.
nm_status nm_gguf_writer_add_tensor(nm_gguf_writer *w, const char *name, uint32_t type,
                                    uint32_t n_dims, const int64_t *ne, const void *data);
// A u32 `general.alignment` added with nm_gguf_writer_add_u32 sets the
// alignment (a nonzero power of two, else NM_ERR_INVALID_ARG); default 32.
// Keys and tensor names must be unique (NM_ERR_INVALID_ARG).
nm_status nm_gguf_writer_write(nm_gguf_writer *w, const char *path);
// Same into a malloc'd buffer: on success *out (caller frees with free()) holds
// *out_size bytes.
nm_status nm_gguf_writer_write_buf(nm_gguf_writer *w, uint8_t **out, size_t *out_size);
// Message of the last failed call on w; "" if none. Borrowed until the next call.
const char *nm_gguf_writer_last_error(const nm_gguf_writer *w);

#endif
