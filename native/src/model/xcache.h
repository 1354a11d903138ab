/* xcache.h - internal: the routed experts of a model larger than memory (RM_LOAD_STREAM).
 *
 * Everything but the routed experts stays in memory; each expert's matrices are read from the
 * files with pread (O_DIRECT where the file system takes it, so neither the page cache nor its
 * read-ahead spends memory on them) into a cache of equal slots that fills the byte budget, and
 * the least often used unit leaves first (counts halved as they age; RAPIDMOE_XCACHE_POLICY=lru
 * for the least recently used). A unit is one expert's base matrices (gate, up,
 * down, or llama.cpp's fused gate_up and down) or its residual's. With prefetch (rm_model_params)
 * a reader thread reads the units the evaluation asks for ahead of use (rm_xcache_prefetch) while
 * the CPU computes. One read runs at a time, the evaluation's first: on the disks measured, two
 * concurrent readers got less than half the throughput each.
 *
 * Slots are handed out in windows: the units got since rm_xcache_begin stay until the next
 * begin, so one window's products may read them all; with a reader a window holds at most half
 * of the slots (the other half is the reader's).
 *
 * The model lock serialises the evaluation's calls; the reader thread takes the cache's own
 * lock. */
#ifndef RM_XCACHE_H
#define RM_XCACHE_H

#include "rapidmoe.h"
#include "weights.h"

typedef struct rm_model rm_model;
typedef struct rm_xcache rm_xcache;

enum { RM_XC_BASE = 0, RM_XC_RES = 1 };
/* a tier's matrices in out[] of rm_xcache_get: base {gate, up, down, gate_up}, residual {gate, up, down, -} */
#define RM_XC_MATS 4

/* The cache of m's experts (bound; their data pointers into the mapped files give the offsets)
 * within cache_bytes, reading path and res_path (NULL without residuals). Fails, saying why, when
 * the budget holds fewer slots than min_slots. */
rm_status rm_xcache_open(const rm_model * m, const char * path, const char * res_path, uint64_t cache_bytes,
                         int32_t min_slots, int prefetch, rm_xcache ** out);   /* prefetch: RM_PREFETCH_* */
void      rm_xcache_free(rm_xcache * c);

/* The number of units one window may hold. */
int32_t rm_xcache_window(const rm_xcache * c);
/* 1 when the next layer's experts are to be predicted and read ahead (RM_PREFETCH_PREDICT). */
int     rm_xcache_predicts(const rm_xcache * c);
/* Starts a window: the units got before are free to leave again. */
void    rm_xcache_begin(rm_xcache * c);
/* Unit (il, e, tier) in memory, out[k] its matrices as 2-D weights (data NULL where the tensor is
 * absent). On a read error or a short read (a truncated file) returns RM_E_IO with the message
 * naming the file, the layer, the expert and the offset; the cache stays usable. */
rm_status rm_xcache_get(rm_xcache * c, int il, int32_t e, int tier, rm_weight out[RM_XC_MATS]);
/* Asks the reader thread for these experts' units of layer il (base, and residual when res is set
 * and the model has one), in order, as far as slots outside the current window allow. */
void    rm_xcache_prefetch(rm_xcache * c, int il, const int32_t * experts, int32_t n, int res);

void    rm_xcache_stats(const rm_xcache * c, rm_expert_cache_stats * out);

#endif
