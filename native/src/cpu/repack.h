/* cpu/repack.h - internal: weights kept in the CPU kernels' stored layout, made once at load.
 *
 * For types whose kernel set has a stored form (rm_packed_kernels.repack_row: Q4_0 and MXFP4 on
 * AVX-512 VNNI), a CPU-only model converts every such matrix of the layers and the output head
 * (rows of at least one group; Q4_0's of whole groups only) into an arena of the same size, and the CPU backend reads those
 * instead of the file's bytes (the one-token kernels then skip their unpacking and horizontal
 * adds). The file's pages of those tensors are released after the copy, so resident memory
 * stays about the file's size. Lookups go by the file address, as a device's copies do
 * (devweights.h). */
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
