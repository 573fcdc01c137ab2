// SPDX-License-Identifier: MIT
/*
 * vca_sgemm: single-precision C = A * B (row-major) for the CPU probe, with
 * no BLAS underneath. AVX2/FMA micro-kernel of 6x16 (12 ymm accumulators,
 * enough to hide the FMA latency), packed panels sized for the caches
 * (KC x NR strips of B stay in L1, an MC x KC block of A in L2), OpenMP over
 * blocks of rows. Built on the node: cc -O3 -mavx2 -mfma -fopenmp -shared -fPIC.
 */
#include <immintrin.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#define MR 6
#define NR 16
#define KC 256
#define MC 120
#define NC 3072

static void pack_b(int kc, int nc, const float *b, int ldb, float *bp)
{
#pragma omp for schedule(static)
	for (int j = 0; j < nc; j += NR) {
		float *dst = bp + (size_t)j * kc;
		const int w = nc - j < NR ? nc - j : NR;
		for (int k = 0; k < kc; k++) {
			const float *src = b + (size_t)k * ldb + j;
			int c = 0;
			for (; c < w; c++)
				dst[k * NR + c] = src[c];
			for (; c < NR; c++)
				dst[k * NR + c] = 0.0f;
		}
	}
}

static void pack_a(int mc, int kc, const float *a, int lda, float *ap)
{
	for (int i = 0; i < mc; i += MR) {
		float *dst = ap + (size_t)i * kc;
		const int h = mc - i < MR ? mc - i : MR;
		for (int k = 0; k < kc; k++) {
			int r = 0;
			for (; r < h; r++)
				dst[k * MR + r] = a[(size_t)(i + r) * lda + k];
			for (; r < MR; r++)
				dst[k * MR + r] = 0.0f;
		}
	}
}

/* C[m x n] += Ap (MR x kc) * Bp (kc x NR); m <= MR, n <= NR at the edges. */
static void micro_6x16(int kc, const float *ap, const float *bp, float *c, int ldc, int m, int n)
{
	__m256 acc[MR][2];
	for (int r = 0; r < MR; r++)
		acc[r][0] = acc[r][1] = _mm256_setzero_ps();
	for (int k = 0; k < kc; k++) {
		const __m256 b0 = _mm256_load_ps(bp);
		const __m256 b1 = _mm256_load_ps(bp + 8);
		for (int r = 0; r < MR; r++) {
			const __m256 a = _mm256_broadcast_ss(ap + r);
			acc[r][0] = _mm256_fmadd_ps(a, b0, acc[r][0]);
			acc[r][1] = _mm256_fmadd_ps(a, b1, acc[r][1]);
		}
		ap += MR;
		bp += NR;
	}
	if (m == MR && n == NR) {
		for (int r = 0; r < MR; r++) {
			float *row = c + (size_t)r * ldc;
			_mm256_storeu_ps(row, _mm256_add_ps(_mm256_loadu_ps(row), acc[r][0]));
			_mm256_storeu_ps(row + 8, _mm256_add_ps(_mm256_loadu_ps(row + 8), acc[r][1]));
		}
		return;
	}
	float tile[MR][NR] __attribute__((aligned(32)));
	for (int r = 0; r < MR; r++) {
		_mm256_store_ps(tile[r], acc[r][0]);
		_mm256_store_ps(tile[r] + 8, acc[r][1]);
	}
	for (int r = 0; r < m; r++)
		for (int j = 0; j < n; j++)
			c[(size_t)r * ldc + j] += tile[r][j];
}

int vca_sgemm_threads(void)
{
	return omp_get_max_threads();
}

int vca_sgemm(int m, int n, int k, const float *a, const float *b, float *c)
{
	if (m <= 0 || n <= 0 || k <= 0)
		return -1;
	float *bp = aligned_alloc(64, (size_t)KC * NC * sizeof(float));
	if (!bp)
		return -2;
	int failed = 0;
	memset(c, 0, (size_t)m * n * sizeof(float));
#pragma omp parallel
	{
		float *ap = aligned_alloc(64, (size_t)MC * KC * sizeof(float));
		if (!ap) {
#pragma omp atomic write
			failed = 1;
		}
		for (int jc = 0; jc < n; jc += NC) {
			const int nc = n - jc < NC ? n - jc : NC;
			for (int pc = 0; pc < k; pc += KC) {
				const int kc = k - pc < KC ? k - pc : KC;
				pack_b(kc, nc, b + (size_t)pc * n + jc, n, bp);	/* ends with the implicit barrier */
#pragma omp for schedule(dynamic)
				for (int ic = 0; ic < m; ic += MC) {
					if (!ap)
						continue;
					const int mc = m - ic < MC ? m - ic : MC;
					pack_a(mc, kc, a + (size_t)ic * k + pc, k, ap);
					for (int jr = 0; jr < nc; jr += NR)
						for (int ir = 0; ir < mc; ir += MR)
							micro_6x16(kc, ap + (size_t)ir * kc, bp + (size_t)jr * kc,
								   c + (size_t)(ic + ir) * n + jc + jr, n,
								   mc - ir < MR ? mc - ir : MR, nc - jr < NR ? nc - jr : NR);
				}
			}
		}
		free(ap);
	}
	free(bp);
	return failed ? -2 : 0;
}
