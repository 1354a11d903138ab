/* cpu/repack.h - internal: weights kept in the CPU kernels' stored layout, made once at load.
 *
 * For types whose kernel set has a stored form (rm_cpu_stored: Q4_0, MXFP4, Q4_K and Q6_K in the
 * AVX2 and AVX-512 sets, Q5_K in the AVX-512 one), a CPU-only model converts every such matrix of
 * the layers and the output head (rows of at least one group of eight blocks, Q4_0's of whole
 * groups only; Q4_K and Q6_K in tiles of sixteen rows, matrices of a whole number of tiles, an
 * expert's rows a matrix) into an arena of the
 * same size, in 2 MiB pages where the kernel has transparent huge pages (decode streams it: one
 * TLB miss per 2 MiB), and the CPU backend reads those instead of the file's bytes. The file's
 * copy of those tensors is handed back after the conversion, so resident memory stays about the
 * file's size: a mapped file's pages are released (they read back from the file), a read copy's
 * are mapped from the file again (rm_gguf_give_back). Lookups go by the file address, as a device's
 * copies do (devweights.h). */
#ifndef RM_REPACK_H
#define RM_REPACK_H

#include "devweights.h"
#include "threads.h"

/* NULL when nothing is repacked (no such type, the kernel set in use has no stored form, or
 * RAPIDMOE_REPACK=0 in the environment, for comparisons);
 * NULL with the error set on out of memory (*failed = 1). */
rm_dev_weights * rm_repack_model(const rm_model * m, rm_pool * pool, int * failed);
void             rm_repack_free(rm_dev_weights * r);

#endif
