// SPDX-License-Identifier: MIT
// A reproduction of the GEMM the VCA tree shipped, for before/after figures:
// one element of C per work-item, every operand from global memory, and no
// local size given at enqueue, so the runtime picks one. On the P580 that
// implicit size is what collapsed N = multiples of 384 to 27 GFLOP/s.
__kernel void sgemm_shipped(const int M, const int N, const int K,
                            __global const float *A,
                            __global const float *B,
                            __global float *C)
{
    const int n = get_global_id(0);
    const int m = get_global_id(1);
    if (m >= M || n >= N)
        return;
    float acc = 0.0f;
    for (int k = 0; k < K; k++)
        acc += A[m * K + k] * B[k * N + n];
    C[m * N + n] = acc;
}
