/* gguf.c - GGUF v3 reader (placeholder until the reader lands). */
#include "status.h"

rm_status rm_gguf_open(const char * path, rm_gguf ** out) { *out = 0; return rm_fail(RM_E_INTERNAL, "rm_gguf_open: not built"); }
void rm_gguf_close(rm_gguf * g) { (void) g; }
uint32_t rm_gguf_version(const rm_gguf * g) { return 0; }
uint32_t rm_gguf_alignment(const rm_gguf * g) { return 0; }
uint64_t rm_gguf_data_offset(const rm_gguf * g) { return 0; }
uint64_t rm_gguf_file_size(const rm_gguf * g) { return 0; }
int64_t rm_gguf_n_kv(const rm_gguf * g) { return 0; }
int64_t rm_gguf_find_kv(const rm_gguf * g, const char * key) { return -1; }
rm_str rm_gguf_kv_key(const rm_gguf * g, int64_t i) { rm_str s = {0, 0}; return s; }
int32_t rm_gguf_kv_type(const rm_gguf * g, int64_t i) { return -1; }
int32_t rm_gguf_kv_arr_type(const rm_gguf * g, int64_t i) { return -1; }
uint64_t rm_gguf_kv_arr_n(const rm_gguf * g, int64_t i) { return 0; }
const void * rm_gguf_kv_data(const rm_gguf * g, int64_t i) { return 0; }
rm_str rm_gguf_kv_str(const rm_gguf * g, int64_t i) { rm_str s = {0, 0}; return s; }
rm_str rm_gguf_kv_arr_str(const rm_gguf * g, int64_t i, uint64_t j) { rm_str s = {0, 0}; return s; }
int64_t rm_gguf_n_tensors(const rm_gguf * g) { return 0; }
int64_t rm_gguf_find_tensor(const rm_gguf * g, const char * name) { return -1; }
rm_status rm_gguf_tensor_info(const rm_gguf * g, int64_t i, rm_tensor_info * out) { return rm_fail(RM_E_INTERNAL, "not built"); }
