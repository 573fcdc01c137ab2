// SPDX-License-Identifier: MIT
// vcafleet tiled SGEMM: C = A * B, row-major, A is MxK, B is KxN, C is MxN.
// The tiling is fixed at compile time (-D...), so one source serves CPU
// OpenCL (PoCL) and GPUs, and the autotuner searches the macros:
//   TM, TN      work-group tile of C (rows, columns)
//   TK          K chunk per step
//   WPTM, WPTN  outputs per work-item (rows, columns)
//   VW          vector width along N (1, 2, 4, 8, 16); WPTN % VW == 0. With
//               local memory, VW > 1 also switches each work-item to a
//               contiguous block read from local memory as vectors
//   LMEM        1: stage A and B chunks in local memory (GPUs)
//               0: read global memory directly, vectorised along N (CPU OpenCL)
//   KBARRIER    1: a barrier per K chunk even without local memory, so that
//               PoCL runs every work-item of the group over one chunk before
//               the next, while that chunk of B is still in cache
//   PF          with LMEM: 1 loads the next K chunk from global memory into
//               registers while the current one is multiplied (latency hiding)
//   PACK        without LMEM: 1 reads A and B from copies packed by pack_a and
//               pack_b (run before sgemm, and timed with it) so that each
//               work-item streams its rows of A and its columns of B as
//               contiguous panels: [panel][k][WPTM] and [panel][k][WPTN]
// The host pads: M % TM == 0, N % TN == 0, K % TK == 0.
// SKIP_LAST_K_TILE (tests only) drops the last K chunk: a deliberately
// wrong kernel that a random-data check must reject.

#ifndef PF
#define PF 0
#endif
#ifndef PACK
#define PACK 0
#endif
#define RTSM (TM / WPTM)   // work-items along M
#define RTSN (TN / WPTN)   // work-items along N
#define WPTNV (WPTN / VW)  // vectors per work-item along N

#define PASTE(a, b) a##b
#define XPASTE(a, b) PASTE(a, b)
#if VW == 1
#define floatv float
#define VLOAD(off, p) ((p)[(off)])
#define VSTORE(v, off, p) ((p)[(off)] = (v))
#else
#define floatv XPASTE(float, VW)
#define VLOAD(off, p) XPASTE(vload, VW)(0, (p) + (off))
#define VSTORE(v, off, p) XPASTE(vstore, VW)((v), 0, (p) + (off))
#endif

#ifdef SKIP_LAST_K_TILE
#define KEND (K - TK)
#else
#define KEND K
#endif

__kernel __attribute__((reqd_work_group_size(RTSN, RTSM, 1)))
void sgemm(const int M, const int N, const int K,
           __global const float *restrict A,
           __global const float *restrict B,
           __global float *restrict C)
{
    const int tn = get_local_id(0);
    const int tm = get_local_id(1);
    const int n0 = get_group_id(0) * TN;
    const int m0 = get_group_id(1) * TM;

#if LMEM
    // As is stored transposed; one float of padding per row keeps the
    // work-items that store one row of A off a single local-memory bank.
    __local float As[TK][TM + 1];
    __local float Bs[TK][TN];
    const int tid = tm * RTSN + tn;
#define NT (RTSM * RTSN)
#if PF
#define LA ((TM * TK + NT - 1) / NT)
#define LB ((TK * TN + NT - 1) / NT)
    float ra[LA], rb[LB];
#define FETCH(k0)                                                          \
    for (int l = 0; l < LA; l++) {                                         \
        const int e = tid + l * NT;                                        \
        if (e < TM * TK) ra[l] = A[(m0 + e / TK) * K + (k0) + e % TK];     \
    }                                                                      \
    for (int l = 0; l < LB; l++) {                                         \
        const int e = tid + l * NT;                                        \
        if (e < TK * TN) rb[l] = B[((k0) + e / TN) * N + n0 + e % TN];     \
    }
    FETCH(0)
#endif
#if VW == 1
    // Each work-item owns rows m0 + tm + i*RTSM and columns n0 + tn + j*RTSN:
    // neighbours touch neighbouring addresses, in global and in local memory.
#define ROW(i) (tm + (i) * RTSM)
#define COL(j) (tn + (j) * RTSN)
#else
    // Each work-item owns a contiguous WPTM x WPTN block and reads its slice
    // of a chunk as VW-wide vectors: a quarter of the local-memory reads.
#define ROW(i) (tm * WPTM + (i))
#define COL(j) (tn * WPTN + (j))
#endif
    floatv acc[WPTM][WPTNV];
    for (int i = 0; i < WPTM; i++)
        for (int j = 0; j < WPTNV; j++)
            acc[i][j] = (floatv)(0.0f);
    for (int k0 = 0; k0 < KEND; k0 += TK) {
#if PF
        for (int l = 0; l < LA; l++) {
            const int e = tid + l * NT;
            if (e < TM * TK) As[e % TK][e / TK] = ra[l];
        }
        for (int l = 0; l < LB; l++) {
            const int e = tid + l * NT;
            if (e < TK * TN) Bs[e / TN][e % TN] = rb[l];
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        if (k0 + TK < KEND) {
            FETCH(k0 + TK)
        }
#else
        for (int e = tid; e < TM * TK; e += NT) {
            const int r = e / TK, c = e % TK;
            As[c][r] = A[(m0 + r) * K + k0 + c];
        }
        for (int e = tid; e < TK * TN; e += NT) {
            const int r = e / TN, c = e % TN;
            Bs[r][c] = B[(k0 + r) * N + n0 + c];
        }
        barrier(CLK_LOCAL_MEM_FENCE);
#endif
        for (int k = 0; k < TK; k++) {
            floatv b[WPTNV];
#if VW == 1
            for (int j = 0; j < WPTN; j++)
                b[j] = Bs[k][COL(j)];
#else
            for (int j = 0; j < WPTNV; j++)
                b[j] = VLOAD(COL(j * VW), &Bs[k][0]);
#endif
            for (int i = 0; i < WPTM; i++) {
                const floatv a = (floatv)(As[k][ROW(i)]);
                for (int j = 0; j < WPTNV; j++)
                    acc[i][j] = mad(a, b[j], acc[i][j]);
            }
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
#if VW == 1
    for (int i = 0; i < WPTM; i++)
        for (int j = 0; j < WPTN; j++)
            C[(m0 + ROW(i)) * N + n0 + COL(j)] = acc[i][j];
#else
    for (int i = 0; i < WPTM; i++)
        for (int j = 0; j < WPTNV; j++)
            VSTORE(acc[i][j], (m0 + ROW(i)) * N + n0 + COL(j * VW), C);
#endif
#else
    // Each work-item owns a WPTM x WPTN block; along N it is read and written
    // as vectors of VW floats, which CPU OpenCL maps onto SIMD registers.
    const int row = m0 + tm * WPTM;
    const int col = n0 + tn * WPTN;
#if PACK
    __global const float *ap = A + (row / WPTM) * K * WPTM;
    __global const float *bp = B + (col / WPTN) * K * WPTN;
#define A_AT(i, k) ap[(k) * WPTM + (i)]
#define B_AT(j, k) VLOAD((k) * WPTN + (j) * VW, bp)
#else
#define A_AT(i, k) A[(row + (i)) * K + (k)]
#define B_AT(j, k) VLOAD((k) * N + col + (j) * VW, B)
#endif
    // Fully unrolled, so that the accumulators are registers, not an array in
    // memory: PoCL's compiler does not unroll these loops by itself. Not with
    // KBARRIER: PoCL 3.1 keeps values that cross a barrier in memory anyway, and
    // unrolled loops around one can abort its compiler (ParallelRegion assertion).
#if KBARRIER
#define UNROLL
#else
#define UNROLL _Pragma("unroll")
#endif
    floatv acc[WPTM][WPTNV];
    UNROLL for (int i = 0; i < WPTM; i++)
        UNROLL for (int j = 0; j < WPTNV; j++)
            acc[i][j] = (floatv)(0.0f);
    for (int k0 = 0; k0 < KEND; k0 += TK) {
        for (int k = k0; k < k0 + TK; k++) {
            floatv b[WPTNV];
            UNROLL for (int j = 0; j < WPTNV; j++)
                b[j] = B_AT(j, k);
            UNROLL for (int i = 0; i < WPTM; i++) {
                const floatv a = (floatv)(A_AT(i, k));
                UNROLL for (int j = 0; j < WPTNV; j++)
                    acc[i][j] = fma(a, b[j], acc[i][j]);   // PoCL turns mad() into a multiply and an add
            }
        }
#if KBARRIER
        barrier(CLK_LOCAL_MEM_FENCE);
#endif
    }
    UNROLL for (int i = 0; i < WPTM; i++)
        UNROLL for (int j = 0; j < WPTNV; j++)
            VSTORE(acc[i][j], (row + i) * N + col + j * VW, C);
#endif
}

#if PACK && !LMEM
// Ap[p][k][i] = A[p * WPTM + i][k]: one work-item per (k, row panel p).
__kernel void pack_a(const int M, const int K, __global const float *restrict A, __global float *restrict Ap)
{
    const int k = get_global_id(0), p = get_global_id(1);
    for (int i = 0; i < WPTM; i++)
        Ap[(p * K + k) * WPTM + i] = A[(p * WPTM + i) * K + k];
}

// Bp[q][k][j] = B[k][q * WPTN + j]: one work-item per (k, column panel q).
__kernel void pack_b(const int K, const int N, __global const float *restrict B, __global float *restrict Bp)
{
    const int k = get_global_id(0), q = get_global_id(1);
    for (int j = 0; j < WPTNV; j++)
        VSTORE(VLOAD(k * N + q * WPTN + j * VW, B), (q * K + k) * WPTN + j * VW, Bp);
}
#endif
