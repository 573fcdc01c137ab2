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
//               2: as 1 with PF, with float4 loads from global memory (the
//                  next chunk fetched into registers while this one is
//                  multiplied; DB below double-buffers local memory), A's chunk stored
//                  transposed with APAD floats of padding per row (4: no bank
//                  conflicts on the store at TK=8, two-way at 16; float4 reads stay aligned), and each work-item's
//                  WPTM x WPTN block split into 4x4 pieces RTSM*4 rows and
//                  RTSN*4 columns apart, read from local memory as float4s
//                  that neighbouring work-items take side by side. Needs
//                  WPTM, WPTN, TK, TN multiples of 4, VW = 1, and the float4s
//                  of a chunk to divide evenly among the work-items
//               0: read global memory directly, vectorised along N (CPU OpenCL)
//   DB          with LMEM 2: 0 (default) one local buffer and two barriers per
//               chunk; 1 double-buffers local memory, one barrier per chunk
//               (slower on the H200: 37.6 against 49.4 TFLOP/s at N=4096)
//   APAD        with LMEM 2: padding of A's local rows (default 4)
//   KBARRIER    1: a barrier per K chunk even without local memory, so that
//               PoCL runs every work-item of the group over one chunk before
//               the next, while that chunk of B is still in cache
//   PF          with LMEM: 1 loads the next K chunk from global memory into
//               registers while the current one is multiplied (latency hiding)
//   PACK        without LMEM: 1 reads A and B from copies packed by pack_a and
//               pack_b (run before sgemm, and timed with it) so that each
//               work-item streams its rows of A and its columns of B as
//               contiguous panels: [panel][k][WPTM] and [panel][k][WPTN]
//   EDGE        with LMEM 2: 1 bounds-checks the work-groups on the edge of C and
//               the last K chunk (zeros outside A and B, no stores outside C),
//               so M, N, K need not be multiples of the tile and nothing is padded;
//               a work-group whose tile lies inside C takes the unchecked path for
//               every whole K chunk and checks only the last, short one
//   AV4, BV4    with EDGE: 1 (default) where A's rows (K % 4 == 0) or B's and C's rows
//               (N % 4 == 0) start 16-byte aligned, so that they are read and written
//               as float4s; 0 reads and writes them with vload4/vstore4 instead (the
//               host sets both from the shape), on the unchecked path too
//   COUNT_CHECKED  (tests only) each work-item stores, instead of its product, how many
//               K chunks it loaded through the checked path
// Without EDGE the host pads M % TM == 0, N % TN == 0, K % TK == 0, on the device
// (pad2d below, timed with the product) and cuts C back (reduce_splits).
// Split K: the third NDRange dimension is the K slice. Work-group z multiplies
// K range [z*KS, min(K, (z+1)*KS)) (KS a multiple of TK) into its own M x N
// slab of C (C + z*M*N); reduce_splits sums the slabs in a fixed order.
// SKIP_LAST_K_TILE (tests only) drops the last K chunk: a deliberately
// wrong kernel that a random-data check must reject.

#ifndef PF
#define PF 0
#endif
#ifndef PACK
#define PACK 0
#endif
#ifndef DB
#define DB 0
#endif
#ifndef APAD
#define APAD 4
#endif
#ifndef EDGE
#define EDGE 0
#endif
#ifndef AV4
#define AV4 1
#endif
#ifndef BV4
#define BV4 1
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
#define KEND (ke - TK)
#else
#define KEND ke
#endif

__kernel __attribute__((reqd_work_group_size(RTSN, RTSM, 1)))
void sgemm(const int M, const int N, const int K, const int KS,
           __global const float *restrict A,
           __global const float *restrict B,
           __global float *restrict Cout)
{
    const int tn = get_local_id(0);
    const int tm = get_local_id(1);
    const int n0 = get_group_id(0) * TN;
    const int m0 = get_group_id(1) * TM;
    const int kb = get_group_id(2) * KS;           // this work-group's K slice
    const int ke = min(K, kb + KS);
    __global float *restrict C = Cout + (size_t)get_group_id(2) * M * N;

#if LMEM == 2
#define NT (RTSM * RTSN)
#define KQ (TK / 4)            // float4s along K in a row of A's chunk
#define NQ (TN / 4)            // float4s along N in a row of B's chunk
#define LA4 (TM * KQ / NT)
#define LB4 (TK * NQ / NT)
#define BM (WPTM / 4)
#define BN (WPTN / 4)
#define NBUF (DB ? 2 : 1)
    __local float As[NBUF][TK][TM + APAD] __attribute__((aligned(16)));
    __local float Bs[NBUF][TK][TN] __attribute__((aligned(16)));
    const int tid = tm * RTSN + tn;
    float4 ra[LA4], rb[LB4];
// four floats of a row of A, or of B or C: one 16-byte access where rows are aligned
#if AV4
#define LOADA4(p) (*(__global const float4 *)(p))
#else
#define LOADA4(p) vload4(0, (p))
#endif
#if BV4
#define LOADB4(p) (*(__global const float4 *)(p))
#define STOREC4(v, p) (*(__global float4 *)(p) = (v))
#else
#define LOADB4(p) vload4(0, (p))
#define STOREC4(v, p) vstore4((v), 0, (p))
#endif
#define FETCH4_FAST(k0)                                                                  \
    for (int l = 0; l < LA4; l++) {                                                      \
        const int e = tid + l * NT;                                                      \
        ra[l] = LOADA4(A + (m0 + e / KQ) * K + (k0) + (e % KQ) * 4);                     \
    }                                                                                    \
    for (int l = 0; l < LB4; l++) {                                                      \
        const int e = tid + l * NT;                                                      \
        rb[l] = LOADB4(B + ((k0) + e / NQ) * N + n0 + (e % NQ) * 4);                     \
    }
#if EDGE
// zeros outside A (M x ke) and B (ke x N); one 4-float load where the four floats are inside,
// else four checked scalar loads (edge work-groups, and the last K chunk where it is short)
#define AE(r, c) (((r) < M && (c) < ke) ? A[(r) * K + (c)] : 0.0f)
#define BE(r, c) (((r) < ke && (c) < N) ? B[(r) * N + (c)] : 0.0f)
#define AQ(r, c) (((r) < M && (c) + 3 < ke) ? LOADA4(A + (r) * K + (c))                      \
                  : (float4)(AE(r, c), AE(r, c + 1), AE(r, c + 2), AE(r, c + 3)))
#define BQ(r, c) (((r) < ke && (c) + 3 < N) ? LOADB4(B + (r) * N + (c))                     \
                  : (float4)(BE(r, c), BE(r, c + 1), BE(r, c + 2), BE(r, c + 3)))
#ifdef COUNT_CHECKED
#define COUNT_ONE checked++;
#else
#define COUNT_ONE
#endif
#define FETCH4(k0)                                                                       \
    {                                                                                    \
        const int whole = (k0) + TK <= ke;                                               \
        if (whole && rows_in) {                                                          \
            for (int l = 0; l < LA4; l++) {                                              \
                const int e = tid + l * NT;                                              \
                ra[l] = LOADA4(A + (m0 + e / KQ) * K + (k0) + (e % KQ) * 4);             \
            }                                                                            \
        } else {                                                                         \
            for (int l = 0; l < LA4; l++) {                                              \
                const int e = tid + l * NT;                                              \
                ra[l] = AQ(m0 + e / KQ, (k0) + (e % KQ) * 4);                            \
            }                                                                            \
        }                                                                                \
        if (whole && cols_in) {                                                          \
            for (int l = 0; l < LB4; l++) {                                              \
                const int e = tid + l * NT;                                              \
                rb[l] = LOADB4(B + ((k0) + e / NQ) * N + n0 + (e % NQ) * 4);             \
            }                                                                            \
        } else {                                                                         \
            for (int l = 0; l < LB4; l++) {                                              \
                const int e = tid + l * NT;                                              \
                rb[l] = BQ((k0) + e / NQ, n0 + (e % NQ) * 4);                            \
            }                                                                            \
        }                                                                                \
        if (!(whole && rows_in && cols_in)) {                                            \
            COUNT_ONE                                                                    \
        }                                                                                \
    }
    // uniform over the work-group: its rows of A and C, its columns of B and C, inside the
    // matrices (whatever the alignment: AV4, BV4). A group off C's right edge alone (narrow N)
    // still reads A unchecked, and one off the bottom edge reads B unchecked.
    const int rows_in = m0 + TM <= M, cols_in = n0 + TN <= N, interior = rows_in && cols_in;
    int checked = 0;
#else
#define FETCH4(k0) FETCH4_FAST(k0)
#endif
#define STORE4(buf)                                                                      \
    for (int l = 0; l < LA4; l++) {                                                      \
        const int e = tid + l * NT, r = e / KQ, c = (e % KQ) * 4;                        \
        As[buf][c][r] = ra[l].x;                                                         \
        As[buf][c + 1][r] = ra[l].y;                                                     \
        As[buf][c + 2][r] = ra[l].z;                                                     \
        As[buf][c + 3][r] = ra[l].w;                                                     \
    }                                                                                    \
    for (int l = 0; l < LB4; l++) {                                                      \
        const int e = tid + l * NT;                                                      \
        *(__local float4 *)&Bs[buf][e / NQ][(e % NQ) * 4] = rb[l];                       \
    }
    float acc[WPTM][WPTN];
    for (int i = 0; i < WPTM; i++)
        for (int j = 0; j < WPTN; j++)
            acc[i][j] = 0.0f;
    FETCH4(kb)
    STORE4(0)
    barrier(CLK_LOCAL_MEM_FENCE);
    int buf = 0;
    for (int k0 = kb; k0 < KEND; k0 += TK) {
        const int more = k0 + TK < KEND;
        if (more) {
            FETCH4(k0 + TK)
        }
#pragma unroll
        for (int k = 0; k < TK; k++) {
            float a[WPTM], b[WPTN];
            for (int i = 0; i < BM; i++) {
                const float4 v = *(__local const float4 *)&As[buf][k][i * RTSM * 4 + tm * 4];
                a[4 * i] = v.x; a[4 * i + 1] = v.y; a[4 * i + 2] = v.z; a[4 * i + 3] = v.w;
            }
            for (int j = 0; j < BN; j++) {
                const float4 v = *(__local const float4 *)&Bs[buf][k][j * RTSN * 4 + tn * 4];
                b[4 * j] = v.x; b[4 * j + 1] = v.y; b[4 * j + 2] = v.z; b[4 * j + 3] = v.w;
            }
            for (int i = 0; i < WPTM; i++)
                for (int j = 0; j < WPTN; j++)
                    acc[i][j] = mad(a[i], b[j], acc[i][j]);
        }
#if DB
        if (more) {
            STORE4(buf ^ 1)
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        buf ^= 1;
#else
        barrier(CLK_LOCAL_MEM_FENCE);
        if (more) {
            STORE4(0)
        }
        barrier(CLK_LOCAL_MEM_FENCE);
#endif
    }
#if EDGE
#ifdef COUNT_CHECKED
    for (int i = 0; i < WPTM; i++)
        for (int j = 0; j < WPTN; j++)
            acc[i][j] = (float)checked;
#endif
    if (!interior) {
        for (int i = 0; i < WPTM; i++) {
            const int row = m0 + (i / 4) * RTSM * 4 + tm * 4 + i % 4;
            if (row >= M)
                continue;
            for (int j = 0; j < BN; j++) {
                const int col = n0 + j * RTSN * 4 + tn * 4;
                if (col + 3 < N) {
                    STOREC4((float4)(acc[i][4 * j], acc[i][4 * j + 1], acc[i][4 * j + 2], acc[i][4 * j + 3]),
                            &C[row * N + col]);
                } else {
                    for (int q = 0; q < 4; q++)
                        if (col + q < N)
                            C[row * N + col + q] = acc[i][4 * j + q];
                }
            }
        }
        return;
    }
#endif
    for (int i = 0; i < WPTM; i++) {
        const int row = m0 + (i / 4) * RTSM * 4 + tm * 4 + i % 4;
        for (int j = 0; j < BN; j++)
            STOREC4((float4)(acc[i][4 * j], acc[i][4 * j + 1], acc[i][4 * j + 2], acc[i][4 * j + 3]),
                    &C[row * N + n0 + j * RTSN * 4 + tn * 4]);
    }
#elif LMEM
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
    FETCH(kb)
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
    for (int k0 = kb; k0 < KEND; k0 += TK) {
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
    for (int k0 = kb; k0 < KEND; k0 += TK) {
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

// dst (rows_p x cols_p) = src (rows x cols) padded with zeros: the device-side padding
// of tilings without EDGE, queued and timed with the product. One work-item per element.
__kernel void pad2d(const int rows, const int cols, const int cols_p,
                    __global const float *restrict src, __global float *restrict dst)
{
    const int c = get_global_id(0), r = get_global_id(1);
    dst[r * cols_p + c] = (r < rows && c < cols) ? src[r * cols + c] : 0.0f;
}

// dst (rows x cols) = sum over s < S of src[s * stride + r * ld + c], in order s = 0, 1, ...:
// split-K's reduction of the slabs, and (S = 1) the cut back of a padded C.
__kernel void reduce_splits(const int rows, const int cols, const int ld, const int S, const int stride,
                            __global const float *restrict src, __global float *restrict dst)
{
    const int c = get_global_id(0), r = get_global_id(1);
    if (r >= rows || c >= cols)
        return;
    float sum = 0.0f;
    for (int s = 0; s < S; s++)
        sum += src[(size_t)s * stride + r * ld + c];
    dst[r * cols + c] = sum;
}

// Products smaller than a tile (CPU OpenCL): one element of C per work-item, bounds
// checked, in one launch: no padding, packing or cut back to pay for.
__kernel void sgemm_direct(const int M, const int N, const int K,
                           __global const float *restrict A,
                           __global const float *restrict B,
                           __global float *restrict C)
{
    const int n = get_global_id(0), m = get_global_id(1);
    if (m >= M || n >= N)
        return;
    float acc = 0.0f;
    for (int k = 0; k < K; k++)
        acc = fma(A[m * K + k], B[k * N + n], acc);
    C[m * N + n] = acc;
}
