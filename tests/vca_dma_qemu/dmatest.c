// SPDX-License-Identifier: GPL-2.0
/*
 * Runs inside the QEMU guest of scripts/dma-kernel-test.sh, against vca_dma
 * bound to QEMU's edu device, whose registers are not a PLX engine's: a copy
 * is started and never completes. One thread WAITs for it (20 s); the main
 * thread unbinds the driver from the device meanwhile. The WAIT must end
 * with -ENODEV (remove() went through while WAIT slept), not by its own
 * timeout, which is what it does when WAIT holds the engine lock across its
 * sleep and remove() has to wait for it. Prints "DMATEST PASS" or "DMATEST FAIL".
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

#include "vca_dma_ioctl.h"

#define WAIT_MS 20000

static int fd;
static struct vca_dma_wait w;
static int wait_ret, wait_errno;
static char src[8192] __attribute__((aligned(4096))), dst[8192] __attribute__((aligned(4096)));

static double now(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

static void *waiter(void *arg)
{
	wait_ret = ioctl(fd, VCA_DMA_IOC_WAIT, &w);
	wait_errno = errno;
	return arg;
}

static int write_file(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");
	int ok;

	if (!f)
		return -1;
	ok = fputs(text, f) >= 0;
	return (fclose(f) == 0 && ok) ? 0 : -1;
}

int main(int argc, char **argv)
{
	struct vca_dma_copy c = { .size = sizeof(c) };
	pthread_t t;
	double t0, t1;

	if (argc != 3) {
		fprintf(stderr, "usage: dmatest /dev/vca_dmaN BDF\n");
		return 2;
	}
	fd = open(argv[1], O_RDWR);
	if (fd < 0) {
		printf("DMATEST FAIL open %s: %s\n", argv[1], strerror(errno));
		return 1;
	}
	memset(src, 0x5a, sizeof(src));
	c.flags = VCA_DMA_DIR_TO_TARGET;
	c.user_addr = (uintptr_t)src;
	c.length = sizeof(src);
	c.target_kind = VCA_DMA_TARGET_USER;
	c.target_offset = (uintptr_t)dst;
	if (ioctl(fd, VCA_DMA_IOC_SUBMIT, &c)) {
		printf("DMATEST FAIL submit: %s\n", strerror(errno));
		return 1;
	}
	printf("DMATEST submitted cookie %llu\n", (unsigned long long)c.cookie);
	w.size = sizeof(w);
	w.cookie = c.cookie;
	w.timeout_ms = WAIT_MS;
	pthread_create(&t, NULL, waiter, NULL);
	sleep(1);		/* WAIT is asleep by now (it polls the copy every few us) */
	t0 = now();
	if (write_file("/sys/bus/pci/drivers/vca_dma/unbind", argv[2])) {
		printf("DMATEST FAIL unbind: %s\n", strerror(errno));
		return 1;
	}
	t1 = now();
	pthread_join(t, NULL);
	printf("DMATEST unbind took %.3f s; WAIT returned %d (%s), status %d\n", t1 - t0, wait_ret,
	       wait_ret ? strerror(wait_errno) : "ok", w.status);
	if (wait_ret != -1 || wait_errno != ENODEV) {
		printf("DMATEST FAIL: WAIT did not end with ENODEV when the engine was removed\n");
		return 1;
	}
	close(fd);
	printf("DMATEST PASS\n");
	return 0;
}
