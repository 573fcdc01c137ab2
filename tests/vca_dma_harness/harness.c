// SPDX-License-Identifier: GPL-2.0
/*
 * The real modules_c/vca_dma/vca_dma.c, compiled unchanged in user space
 * against vca_shim.h, plus the fakes it calls: a PCI bus of three functions,
 * a register file whose "engine" (a thread) completes descriptors, recording
 * DMA mappings, devres, a misc device core and the plx_mbox API. Built as a
 * shared library; tests/test_vca_dma_driver.py drives it with ctypes (h_*).
 */
#include "vca_shim.h"

#include "vca_dma.c"

#define H_IOVA_BASE	0x500000000000ULL	/* dma_map_resource() answers phys + this */
#define H_LOG_MAX	4096

struct h_desc { u64 src, dst; u32 len; };
struct h_map { u64 phys, size, dma; };

static struct {
	int cap, signal, hold, delay_us, open_on_register, map_fail, mbox, verbose;
	int abort_never, dead, hole, wb_short, latched, window_dead;
	int ring_alloc_fail, misc_fail, pin_fail, sg_map_fail, pin_block, mbox_gone;
	int no_msi, irq_lost;
} cfg;

static struct {
	struct h_desc desc[H_LOG_MAX];
	int ndesc;
	struct h_map map[VCA_DMA_MAX_WINDOWS];
	int nmap, nunmap;
	int regs_after_release, gone_at_deregister;
	int rings, ring_device;
	u32 ring_value;
	int cfg_clobbered, aborts, starts, bad_mode, ring_write_running, bad_addr;
	int write_after_free, late_writes, dma_dropped, abort_never_seen, pin_longterm, pins;
	int coherent_live, sg_live, pinning, master_at_free, puts;
	int irqs, irqs_handled, irq_live;
} rec;

struct bus_type pci_bus_type;
static u32 regs[0x1000 / 4];
static bool released;
static struct pci_driver *bound_drv;
static struct pci_dev *bound_dev;
static struct miscdevice *misc_dev;
static struct file *early_file;
static pthread_mutex_t eng_mx = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t eng_cv = PTHREAD_COND_INITIALIZER;
static int eng_abort, eng_wb;
static unsigned int eng_idx, eng_gen;
static pthread_t eng_thread;
static bool eng_started;

/*
 * The bus: the engine is function 1 of the PLX switch's upstream port (03:00),
 * whose downstream port 04:01.0 leads to the NT function 05:00.0 (BAR 2: the
 * A-LUT windows; BAR 4 never assigned). A second PLX switch elsewhere (20:00.0)
 * and a NIC have BARs too, and no window may point into them.
 */
static struct pci_bus bus3 = { 3 }, bus4 = { 4 }, bus5 = { 5 }, bus20 = { 0x20 }, bus30 = { 0x30 };
#define H_DEVFN(slot, fn)	(((slot) << 3) | (fn))
static struct pci_dev pdevs[] = {
	{ .vendor = 0x10b5, .device = 0x87d0, .name = "0000:03:00.1", .driver_override = "vca_dma",
	  .bus = &bus3, .devfn = H_DEVFN(0, 1),
	  .resource = { [0] = { 0xf0000000, 0xf001ffff, IORESOURCE_MEM } } },
	{ .vendor = 0x10b5, .device = 0x8733, .name = "0000:03:00.0", .bus = &bus3,
	  .devfn = H_DEVFN(0, 0) },
	{ .vendor = 0x10b5, .device = 0x8733, .name = "0000:04:01.0", .bus = &bus4,
	  .devfn = H_DEVFN(1, 0), .upstream = &pdevs[1] },
	{ .vendor = 0x10b5, .device = 0x87b0, .name = "0000:05:00.0", .bus = &bus5,
	  .devfn = H_DEVFN(0, 0), .upstream = &pdevs[2],
	  .resource = { [0] = { 0xf1000000, 0xf103ffff, IORESOURCE_MEM },
			[2] = { 0x3800000000, 0x380fffffff, IORESOURCE_MEM },
			[4] = { 0, 0xfffff, IORESOURCE_MEM | IORESOURCE_UNSET } } },
	{ .vendor = 0x10b5, .device = 0x87b0, .name = "0000:20:00.0", .bus = &bus20,
	  .devfn = H_DEVFN(0, 0),
	  .resource = { [2] = { 0x3900000000, 0x390fffffff, IORESOURCE_MEM } } },
	{ .vendor = 0x8086, .device = 0x1533, .name = "0000:30:00.0", .bus = &bus30,
	  .resource = { [0] = { 0x4000000000, 0x400fffffff, IORESOURCE_MEM } } },
};

static int warns;

int h_warn(const char *fmt, ...)
{
	warns++;
	return 1;
}

void h_log(const char *fmt, ...)
{
	va_list ap;

	if (!cfg.verbose)
		return;
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
}

s64 h_clock_ns(int real)
{
	struct timespec ts;

	clock_gettime(real ? CLOCK_REALTIME : CLOCK_MONOTONIC, &ts);
	return (s64)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

void h_sleep_us(unsigned long us)
{
	struct timespec ts = { us / 1000000, (us % 1000000) * 1000 };

	nanosleep(&ts, NULL);
}

bool h_signal_pending(void) { return __atomic_load_n(&cfg.signal, __ATOMIC_SEQ_CST); }
bool capable(int cap) { return cap == CAP_SYS_RAWIO && cfg.cap; }

int strscpy(char *dst, const char *src, size_t n)
{
	snprintf(dst, n, "%s", src);
	return strlen(src) < n ? (int)strlen(src) : -E2BIG;
}

int match_string(const char * const *array, size_t n, const char *s)
{
	size_t i;

	for (i = 0; i < n; i++)
		if (array[i] && !strcmp(array[i], s))
			return i;
	return -EINVAL;
}

int kstrtou64(const char *s, unsigned int base, u64 *res)
{
	char *end;

	errno = 0;
	*res = strtoull(s, &end, base);
	return (!*s || *end || errno) ? -EINVAL : 0;
}

int kstrtoint(const char *s, unsigned int base, int *res)
{
	char *end;

	errno = 0;
	*res = strtol(s, &end, base);
	return (!*s || *end || errno) ? -EINVAL : 0;
}

int sysfs_emit(char *buf, const char *fmt, ...)
{
	va_list ap;
	int n;

	va_start(ap, fmt);
	n = vsnprintf(buf, PAGE_SIZE, fmt, ap);
	va_end(ap);
	return n;
}

void get_random_bytes(void *buf, size_t n)
{
	while (n--)
		((u8 *)buf)[n] = rand();
}

int copy_struct_from_user(void *dst, size_t ksize, const void *src, size_t usize)
{
	size_t i;

	for (i = ksize; i < usize; i++)
		if (((const u8 *)src)[i])
			return -E2BIG;
	memset(dst, 0, ksize);
	memcpy(dst, src, min(ksize, usize));
	return 0;
}

/* a fake page is its user address: the identity "IOMMU" maps it back */
int pin_user_pages_fast(unsigned long start, int n, unsigned int flags, struct page **pages)
{
	int i;

	rec.pins++;
	if (flags & FOLL_LONGTERM)
		rec.pin_longterm++;
	/* pin_block: a fault that blocks (userfaultfd, FUSE): pinning waits until it is cleared */
	__atomic_store_n(&rec.pinning, 1, __ATOMIC_SEQ_CST);
	while (__atomic_load_n(&cfg.pin_block, __ATOMIC_SEQ_CST))
		h_sleep_us(1000);
	__atomic_store_n(&rec.pinning, 0, __ATOMIC_SEQ_CST);
	if (cfg.pin_fail)
		return -EFAULT;

	for (i = 0; i < n; i++)
		pages[i] = (struct page *)(start + i * PAGE_SIZE);
	return n;
}

int sg_alloc_table_from_pages(struct sg_table *sgt, struct page **pages, unsigned int n,
			      unsigned int off, unsigned long size, gfp_t gfp)
{
	unsigned int i;

	sgt->sgl = calloc(n, sizeof(*sgt->sgl));
	if (!sgt->sgl)
		return -ENOMEM;
	for (i = 0; i < n; i++) {
		unsigned long o = i ? 0 : off, l = min(PAGE_SIZE - o, size);

		sgt->sgl[i].dma_address = (uintptr_t)pages[i] + o;
		sgt->sgl[i].dma_length = l;
		size -= l;
	}
	sgt->nents = n;
	sgt->orig_nents = n;
	return 0;
}

/*
 * ---- the engine: a strict model of the PEX87xx DMA channel ----
 *
 * It behaves as the two public drivers of the engine expect it to
 * (drivers/dma/plx_dma.c in Linux, plx87xx_dma in Intel VCA 2.3.26), not as
 * any one driver happens to drive it:
 *  - CTRL bits 31, 12, 10:8 and INTR bits 21:16 are status: they latch until
 *    a 1 is written to them; CTRL bit 30 (in progress) is read-only; CTRL
 *    bits 29:13 are configuration the firmware left there (H_CTRL_CFG), and a
 *    write that changes them is counted;
 *  - a started channel runs the ring from NEXT_DESC while descriptors are
 *    VALID; only with write-back enabled (CTRL bit 2 in the START write) does
 *    it write a finished descriptor back: VALID cleared, bit 30 success, bits
 *    29/28 read/write failure, the size field the bytes moved;
 *  - a descriptor whose source or destination is not a live DMA mapping stops
 *    the channel with INTR ERROR latched (and a failure write-back);
 *  - ABORT stops it and latches ABORT_DONE, unless abort_never is set: then
 *    the channel stays in progress and, once abort_never is cleared, finishes
 *    the descriptor it held, a late write, if bus mastering is still on;
 *  - with bus mastering off it touches no memory at all;
 *  - dead: every register reads all ones (a function that no longer answers).
 */
#define H_CTRL_CFG		0x0c0a6000U	/* bits 29:13 as firmware left them */
#define H_CTRL_W1C		(BIT(31) | BIT(12) | BIT(10) | BIT(9) | BIT(8))
#define H_CTRL_CFG_MASK		0x3fffe000U
#define H_INTR_STATUS		0x003f0000U
#define H_MAX_RANGES		256

struct h_range { u64 start, len; bool live, window; };
static struct h_range ranges[H_MAX_RANGES];
static int nranges, sg_seen;
static bool bus_master;

static void range_add(u64 start, u64 len, bool window)
{
	if (nranges < H_MAX_RANGES)
		ranges[nranges++] = (struct h_range){ start, len, true, window };
}

static void range_drop(u64 start)
{
	int i;

	for (i = 0; i < nranges; i++)
		if (ranges[i].live && ranges[i].start == start) {
			ranges[i].live = false;
			return;
		}
}

/* the mapping [a, a+len) lies in: NULL if none; *dead: it lies in one that was unmapped or freed */
static struct h_range *range_find(u64 a, u64 len, bool *dead)
{
	int i;

	*dead = false;
	for (i = nranges - 1; i >= 0; i--) {
		if (a < ranges[i].start || a + len > ranges[i].start + ranges[i].len)
			continue;
		if (ranges[i].live)
			return &ranges[i];
		*dead = true;
	}
	return NULL;
}

static u32 *reg(const void *addr)
{
	if (released)
		rec.regs_after_release++;
	return (u32 *)addr;
}

static u32 *chan(u32 off)
{
	return &regs[(VCA_DMA_CHAN_BASE + off) / 4];
}

static u32 chan_reg(u32 off)
{
	return __atomic_load_n(chan(off), __ATOMIC_SEQ_CST);
}

static void chan_set(u32 off, u32 val)
{
	__atomic_store_n(chan(off), val, __ATOMIC_SEQ_CST);
}

u32 ioread32(const void *addr)
{
	u32 *r = reg(addr);

	if (__atomic_load_n(&cfg.dead, __ATOMIC_SEQ_CST))
		return ~0U;
	return __atomic_load_n(r, __ATOMIC_SEQ_CST);
}

static bool eng_running(void)
{
	return chan_reg(VCA_DMA_CTRL) & VCA_DMA_CTRL_IN_PROGRESS;
}

static void ctrl_write(u32 val)
{
	u32 old = chan_reg(VCA_DMA_CTRL), now;

	if ((val & H_CTRL_CFG_MASK) != (old & H_CTRL_CFG_MASK))
		rec.cfg_clobbered++;
	now = (old & H_CTRL_W1C & ~val) | (old & VCA_DMA_CTRL_IN_PROGRESS) |
	      (val & H_CTRL_CFG_MASK) | (val & 0xff & ~(VCA_DMA_CTRL_ABORT | VCA_DMA_CTRL_START));
	if (val & VCA_DMA_CTRL_ABORT) {
		rec.aborts++;
		if (!(now & VCA_DMA_CTRL_IN_PROGRESS) && !cfg.abort_never)
			now |= VCA_DMA_CTRL_ABORT_DONE;	/* nothing to stop */
		else
			eng_abort = 1;
	} else if ((val & VCA_DMA_CTRL_START) && !(now & VCA_DMA_CTRL_IN_PROGRESS)) {
		rec.starts++;
		if ((val & (3U << 5)) != VCA_DMA_CTRL_OFFCHIP_MODE) {
			rec.bad_mode++;
		} else {
			eng_wb = !!(val & VCA_DMA_CTRL_WB_ENABLE);
			eng_abort = 0;
			now |= VCA_DMA_CTRL_IN_PROGRESS;
		}
	}
	chan_set(VCA_DMA_CTRL, now);
}

void iowrite32(u32 val, void *addr)
{
	u32 off = (u32)((u8 *)reg(addr) - (u8 *)regs) - VCA_DMA_CHAN_BASE;

	pthread_mutex_lock(&eng_mx);
	if (cfg.dead)
		off = ~0U;		/* a function that does not answer takes no writes */
	switch (off) {
	case VCA_DMA_CTRL:
		ctrl_write(val);
		break;
	case VCA_DMA_INTR:
		chan_set(off, (val & 0xffff) | (chan_reg(off) & H_INTR_STATUS & ~val));
		break;
	case ~0U:
		break;
	case VCA_DMA_RING_ADDR_LO: case VCA_DMA_RING_ADDR_HI: case VCA_DMA_RING_SIZE:
	case VCA_DMA_NEXT_DESC_LO:
		if (eng_running())
			rec.ring_write_running++;
		chan_set(off, val);
		break;
	default:
		chan_set(off, val);
	}
	pthread_cond_broadcast(&eng_cv);
	pthread_mutex_unlock(&eng_mx);
}

/* ---- the MSI: the engine raises it, outside its lock, as the hardware would ---- */
static irq_handler_t irq_fn;
static void *irq_data;
static pthread_mutex_t wq_mx = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t wq_cv = PTHREAD_COND_INITIALIZER;

int pci_alloc_irq_vectors(struct pci_dev *pdev, unsigned int min, unsigned int max, unsigned int flags)
{
	return cfg.no_msi ? -ENOSPC : 1;
}

void pci_free_irq_vectors(struct pci_dev *pdev) { }
int pci_irq_vector(struct pci_dev *pdev, unsigned int nr) { return 42; }

int request_irq(unsigned int irq, irq_handler_t handler, unsigned long flags, const char *name,
		void *data)
{
	pthread_mutex_lock(&eng_mx);
	irq_fn = handler;
	irq_data = data;
	rec.irq_live = 1;
	pthread_mutex_unlock(&eng_mx);
	return 0;
}

void free_irq(unsigned int irq, void *data)
{
	pthread_mutex_lock(&eng_mx);
	irq_fn = NULL;
	rec.irq_live = 0;
	pthread_mutex_unlock(&eng_mx);
}

void wake_up(wait_queue_head_t *q)
{
	pthread_mutex_lock(&wq_mx);
	pthread_cond_broadcast(&wq_cv);
	pthread_mutex_unlock(&wq_mx);
}

void h_wq_wait(void)
{
	struct timespec t;

	clock_gettime(CLOCK_REALTIME, &t);
	t.tv_nsec += 1000000;
	t.tv_sec += t.tv_nsec / 1000000000;
	t.tv_nsec %= 1000000000;
	pthread_mutex_lock(&wq_mx);
	pthread_cond_timedwait(&wq_cv, &wq_mx, &t);
	pthread_mutex_unlock(&wq_mx);
}

/* Engine lock held: raise the MSI if a status bit that interrupts is latched (dropping the lock). */
static void eng_irq(void)
{
	u32 intr = chan_reg(VCA_DMA_INTR);
	irq_handler_t fn = irq_fn;

	if (!fn || !bus_master || cfg.irq_lost)
		return;
	if (!(intr & VCA_DMA_INTR_DESC_DONE) &&
	    !((intr & VCA_DMA_INTR_ERROR) && (intr & VCA_DMA_INTR_ERROR_EN)) &&
	    !((intr & VCA_DMA_INTR_INVALID) && (intr & VCA_DMA_INTR_INVALID_EN)))
		return;
	rec.irqs++;
	pthread_mutex_unlock(&eng_mx);
	if (fn(42, irq_data) == IRQ_HANDLED)
		__atomic_add_fetch(&rec.irqs_handled, 1, __ATOMIC_SEQ_CST);
	pthread_mutex_lock(&eng_mx);
}

/* Sleep delay_us, and on while held; false if an abort or a reset came meanwhile. Engine lock held. */
static bool eng_work(unsigned int gen)
{
	struct timespec t;

	clock_gettime(CLOCK_REALTIME, &t);
	t.tv_nsec += (long)cfg.delay_us * 1000;
	t.tv_sec += t.tv_nsec / 1000000000;
	t.tv_nsec %= 1000000000;
	while (!eng_abort && gen == eng_gen && pthread_cond_timedwait(&eng_cv, &eng_mx, &t) == 0)
		;
	while (!eng_abort && gen == eng_gen && cfg.hold)
		pthread_cond_wait(&eng_cv, &eng_mx);
	return !eng_abort && gen == eng_gen;
}

static void eng_stop(u32 ctrl_status)
{
	chan_set(VCA_DMA_CTRL, (chan_reg(VCA_DMA_CTRL) & ~VCA_DMA_CTRL_IN_PROGRESS) | ctrl_status);
}

/* One descriptor: check, move, write back. false: the channel stopped on an error. */
static bool eng_desc(struct vca_dma_desc *d, u32 c)
{
	u32 hi = d->addr_hi, len = c & VCA_DMA_DESC_SIZE_MASK, wb;
	u64 src = ((u64)(hi >> 16) << 32) | d->src_lo, dst = ((u64)(hi & 0xffff) << 32) | d->dst_lo;
	struct h_range *rs, *rd;
	bool sdead, ddead;

	rs = range_find(src, len, &sdead);
	rd = range_find(dst, len, &ddead);
	if (ddead)
		rec.write_after_free++;
	if (!rs || !rd) {
		if (eng_wb)
			WRITE_ONCE(d->ctl_size, !rs ? VCA_DMA_DESC_SRC_LINK_ERR : VCA_DMA_DESC_DST_LINK_ERR);
		chan_set(VCA_DMA_INTR, chan_reg(VCA_DMA_INTR) | VCA_DMA_INTR_ERROR);
		rec.bad_addr++;
		return false;
	}
	if (!rs->window && !rd->window)
		memmove((void *)(uintptr_t)dst, (void *)(uintptr_t)src, len);
	if (rec.ndesc < H_LOG_MAX)
		rec.desc[rec.ndesc++] = (struct h_desc){ src, dst, len };
	if (eng_wb) {
		wb = len >= (u32)cfg.wb_short ? len - cfg.wb_short : len;
		WRITE_ONCE(d->ctl_size, BIT(30) | wb);		/* success, bytes moved */
	}
	if (c & VCA_DMA_DESC_INTR)
		chan_set(VCA_DMA_INTR, chan_reg(VCA_DMA_INTR) | VCA_DMA_INTR_DESC_DONE);
	return true;
}

/* An abort arrived while descriptor @d was held. Engine lock held. */
static void eng_abort_held(struct vca_dma_desc *d, u32 c, u64 base, unsigned int gen)
{
	bool dead;

	while (cfg.abort_never && gen == eng_gen)
		pthread_cond_wait(&eng_cv, &eng_mx);
	if (gen != eng_gen)
		return;
	if (rec.abort_never_seen) {
		/* abort_never was cleared: the held descriptor is written late, if the bus lets it */
		if (!bus_master) {
			rec.dma_dropped++;
		} else {
			rec.late_writes++;
			if (!range_find(base, sizeof(*d), &dead) && dead)
				rec.write_after_free++;
			eng_desc(d, c);
		}
	}
	eng_abort = 0;
	eng_stop(VCA_DMA_CTRL_ABORT_DONE);
}

static void *eng_main(void *arg)
{
	pthread_mutex_lock(&eng_mx);
	for (;;) {
		struct vca_dma_desc *ring, *d;
		unsigned int gen;
		u64 base;
		bool dead;
		u32 c;

		while (!eng_running())
			pthread_cond_wait(&eng_cv, &eng_mx);
		gen = eng_gen;
		if (!bus_master || cfg.dead) {
			rec.dma_dropped++;	/* no fetch: the channel stalls */
			pthread_cond_wait(&eng_cv, &eng_mx);
			continue;
		}
		base = ((u64)chan_reg(VCA_DMA_RING_ADDR_HI) << 32) | chan_reg(VCA_DMA_RING_ADDR_LO);
		eng_idx = (chan_reg(VCA_DMA_NEXT_DESC_LO) - (u32)base) / sizeof(*d);
		ring = (void *)(uintptr_t)base;
		if (eng_idx >= VCA_DMA_RING_LEN || !range_find(base, sizeof(*ring) * (eng_idx + 1), &dead)) {
			if (dead)
				rec.write_after_free++;
			chan_set(VCA_DMA_INTR, chan_reg(VCA_DMA_INTR) | VCA_DMA_INTR_ERROR);
			eng_stop(0);
			continue;
		}
		d = &ring[eng_idx];
		c = READ_ONCE(d->ctl_size);
		if (!(c & VCA_DMA_DESC_VALID)) {
			eng_stop(VCA_DMA_CTRL_DESC_INVALID);
			continue;
		}
		if (!eng_work(gen)) {
			if (gen == eng_gen) {
				if (cfg.abort_never)
					rec.abort_never_seen = 1;
				eng_abort_held(d, c, base, gen);
			}
			continue;
		}
		if (!eng_desc(d, c)) {
			eng_stop(0);
			eng_irq();
			continue;
		}
		eng_idx = (eng_idx + 1) % VCA_DMA_RING_LEN;
		chan_set(VCA_DMA_NEXT_DESC_LO, (u32)base + eng_idx * sizeof(*d));
		eng_irq();
	}
	return arg;
}

/* ---- PCI, devres, DMA mapping, misc ---- */

struct device_driver *driver_find(const char *name, struct bus_type *bus) { return NULL; }

struct pci_dev *pci_get_device(unsigned int vendor, unsigned int device, struct pci_dev *from)
{
	size_t i = from ? (size_t)(from - pdevs) + 1 : 0;

	for (; i < sizeof(pdevs) / sizeof(pdevs[0]); i++) {
		if (pdevs[i].vendor != vendor)
			continue;
		if (device == PCI_ANY_ID || pdevs[i].device == device)
			return &pdevs[i];
	}
	return NULL;
}

void __iomem *pcim_iomap(struct pci_dev *pdev, int bar, unsigned long maxlen)
{
	return bar == 0 ? regs : NULL;
}

static void range_add_locked(u64 start, u64 len, bool window)
{
	pthread_mutex_lock(&eng_mx);
	range_add(start, len, window);
	pthread_mutex_unlock(&eng_mx);
}

static void range_drop_locked(u64 start)
{
	pthread_mutex_lock(&eng_mx);
	range_drop(start);
	pthread_mutex_unlock(&eng_mx);
}

/* Freed memory is only marked dead, never handed back: the engine may still write it. */
static void *coherent(size_t size, dma_addr_t *dma)
{
	void *p;

	if (cfg.ring_alloc_fail && size == sizeof(struct vca_dma_desc) * VCA_DMA_RING_LEN)
		return NULL;
	p = calloc(1, size);
	*dma = (uintptr_t)p;
	range_add_locked(*dma, size, false);
	rec.coherent_live++;
	return p;
}

void *dma_alloc_coherent(struct device *dev, size_t size, dma_addr_t *dma, gfp_t gfp)
{
	return coherent(size, dma);
}

void dma_free_coherent(struct device *dev, size_t size, void *cpu, dma_addr_t dma)
{
	if (bus_master)
		rec.master_at_free++;
	range_drop_locked(dma);
	rec.coherent_live--;
	memset(cpu, 0xa5, size);
}

/* devres after probe failed or remove() returned: the registers are gone, the function disabled */
static void devres_release(void)
{
	released = true;
	pci_clear_master(NULL);		/* pcim_enable_device's release disables the function */
}

dma_addr_t dma_map_resource(struct device *dev, phys_addr_t phys, size_t size,
			    enum dma_data_direction dir, unsigned long attrs)
{
	if (cfg.map_fail == rec.nmap + 1)	/* map_fail: the Nth mapping fails */
		return DMA_MAPPING_ERROR;
	rec.map[rec.nmap] = (struct h_map){ phys, size, phys + H_IOVA_BASE };
	if (!cfg.window_dead)
		range_add_locked(phys + H_IOVA_BASE, size, true);
	return rec.map[rec.nmap++].dma;
}

void dma_unmap_resource(struct device *dev, dma_addr_t addr, size_t size,
			enum dma_data_direction dir, unsigned long attrs)
{
	range_drop_locked(addr);
	rec.nunmap++;
}

/* hole: the Nth scatterlist entry mapped since reset is left out of the "IOMMU" */
int dma_map_sgtable(struct device *dev, struct sg_table *sgt, enum dma_data_direction dir,
		    unsigned long attrs)
{
	unsigned int i;

	if (cfg.sg_map_fail)
		return -ENOMEM;
	for (i = 0; i < sgt->nents; i++)
		if (++sg_seen != cfg.hole)
			range_add_locked(sgt->sgl[i].dma_address, sgt->sgl[i].dma_length, false);
	rec.sg_live++;
	return 0;
}

void dma_unmap_sgtable(struct device *dev, struct sg_table *sgt, enum dma_data_direction dir,
		       unsigned long attrs)
{
	unsigned int i;

	for (i = 0; i < sgt->nents; i++)
		range_drop_locked(sgt->sgl[i].dma_address);
	rec.sg_live--;
}

void pci_set_master(struct pci_dev *pdev)
{
	pthread_mutex_lock(&eng_mx);
	bus_master = true;
	pthread_cond_broadcast(&eng_cv);
	pthread_mutex_unlock(&eng_mx);
}

void pci_clear_master(struct pci_dev *pdev)
{
	pthread_mutex_lock(&eng_mx);
	bus_master = false;
	pthread_mutex_unlock(&eng_mx);
}

int pci_read_config_word(struct pci_dev *pdev, int where, u16 *val)
{
	*val = where == PCI_COMMAND ? (PCI_COMMAND_MASTER * bus_master) | 0x2 : 0;
	return 0;
}


static struct file *file_open(int *err)
{
	struct file *f = calloc(1, sizeof(*f));
	static struct inode inode;

	f->private_data = misc_dev;	/* as misc_open() leaves it */
	*err = misc_dev->fops->open(&inode, f);
	if (*err) {
		free(f);
		return NULL;
	}
	return f;
}

int misc_register(struct miscdevice *misc)
{
	int err;

	if (cfg.misc_fail)
		return -EIO;
	misc_dev = misc;
	if (cfg.open_on_register)
		early_file = file_open(&err);
	return 0;
}

void misc_deregister(struct miscdevice *misc)
{
	rec.gone_at_deregister = container_of(misc, struct vca_dma, misc)->gone;
	misc_dev = NULL;
}

long compat_ptr_ioctl(struct file *file, unsigned int cmd, unsigned long arg) { return -ENOTTY; }

int pci_register_driver(struct pci_driver *drv)
{
	bound_drv = drv;
	return 0;
}

void pci_unregister_driver(struct pci_driver *drv)
{
	if (bound_dev) {
		drv->remove(bound_dev);
		devres_release();
		bound_dev = NULL;
	}
	bound_drv = NULL;
}

/* plx_mbox (API 2), as the patched plx87xx exports it; mbox_gone: plx87xx unbound after get() */
struct plx_mbox { int id; };
static struct plx_mbox mboxes[16];
struct plx_mbox *plx_mbox_get(int id) { return id >= 0 && id < 16 ? &mboxes[id] : NULL; }
void plx_mbox_put(struct plx_mbox *mbox) { rec.puts++; }
int plx_mbox_api_version(void) { return PLX_MBOX_API_VERSION; }

int plx_mbox_spad_write(struct plx_mbox *mbox, unsigned int idx, u32 val)
{
	if (cfg.mbox_gone)
		return -ENODEV;
	rec.ring_value = val;
	return 0;
}

int plx_mbox_ring(struct plx_mbox *mbox, unsigned int db)
{
	if (cfg.mbox_gone)
		return -ENODEV;
	rec.rings++;
	rec.ring_device = mbox - mboxes;
	return 0;
}

void *h_symbol_get(const char *name, void *fn) { return cfg.mbox ? fn : NULL; }
void h_symbol_put(const char *name) { }

/* ---- what the test drives ---- */

void h_reset(void)
{
	if (bound_drv)
		pci_unregister_driver(bound_drv);
	pthread_mutex_lock(&eng_mx);
	if (!eng_started)
		eng_started = !pthread_create(&eng_thread, NULL, eng_main, NULL);
	eng_gen++;		/* a descriptor held for the last test lets go, untouched */
	eng_abort = 0;
	memset(&cfg, 0, sizeof(cfg));
	memset(&rec, 0, sizeof(rec));
	warns = 0;
	memset(regs, 0, sizeof(regs));
	regs[(VCA_DMA_CHAN_BASE + VCA_DMA_CTRL) / 4] = H_CTRL_CFG;
	nranges = 0;
	sg_seen = 0;
	bus_master = false;
	pthread_cond_broadcast(&eng_cv);
	pthread_mutex_unlock(&eng_mx);
	cfg.cap = 1;
	cfg.mbox = 1;
	cfg.verbose = !!getenv("VCA_HARNESS_VERBOSE");
	released = false;
	early_file = NULL;
	n_win = 0;
	memset(win, 0, sizeof(win));
}

/* status bits a previous owner left latched: INTR ERROR and INVALID, CTRL header log */
void h_latch(void)
{
	pthread_mutex_lock(&eng_mx);
	chan_set(VCA_DMA_INTR, chan_reg(VCA_DMA_INTR) | VCA_DMA_INTR_ERROR | VCA_DMA_INTR_INVALID);
	chan_set(VCA_DMA_CTRL, chan_reg(VCA_DMA_CTRL) | VCA_DMA_CTRL_HEADER_LOG |
		 VCA_DMA_CTRL_DESC_INVALID);
	pthread_mutex_unlock(&eng_mx);
}

u32 h_reg(u32 off)
{
	return chan_reg(off);
}

void h_set(const char *what, int value)
{
	static const struct { const char *name; int *field; } knobs[] = {
		{ "cap", &cfg.cap }, { "signal", &cfg.signal }, { "hold", &cfg.hold },
		{ "delay_us", &cfg.delay_us }, { "open_on_register", &cfg.open_on_register },
		{ "map_fail", &cfg.map_fail }, { "mbox", &cfg.mbox },
		{ "abort_never", &cfg.abort_never }, { "dead", &cfg.dead }, { "hole", &cfg.hole },
		{ "wb_short", &cfg.wb_short }, { "window_dead", &cfg.window_dead },
		{ "ring_alloc_fail", &cfg.ring_alloc_fail }, { "misc_fail", &cfg.misc_fail },
		{ "pin_fail", &cfg.pin_fail }, { "sg_map_fail", &cfg.sg_map_fail },
		{ "pin_block", &cfg.pin_block }, { "mbox_gone", &cfg.mbox_gone },
		{ "no_msi", &cfg.no_msi }, { "irq_lost", &cfg.irq_lost },
	};
	int *field = NULL;
	size_t i;

	for (i = 0; i < sizeof(knobs) / sizeof(knobs[0]); i++)
		if (!strcmp(knobs[i].name, what))
			field = knobs[i].field;

	if (!field)
		abort();
	pthread_mutex_lock(&eng_mx);
	__atomic_store_n(field, value, __ATOMIC_SEQ_CST);
	pthread_cond_broadcast(&eng_cv);
	pthread_mutex_unlock(&eng_mx);
}

/* rec's counters by name */
long long h_get(const char *what)
{
	static const struct { const char *name; int *field; } counters[] = {
		{ "ndesc", &rec.ndesc }, { "nmap", &rec.nmap }, { "nunmap", &rec.nunmap },
		{ "regs_after_release", &rec.regs_after_release },
		{ "gone_at_deregister", &rec.gone_at_deregister }, { "rings", &rec.rings },
		{ "ring_device", &rec.ring_device }, { "cfg_clobbered", &rec.cfg_clobbered },
		{ "aborts", &rec.aborts }, { "starts", &rec.starts }, { "bad_mode", &rec.bad_mode },
		{ "ring_write_running", &rec.ring_write_running }, { "bad_addr", &rec.bad_addr },
		{ "write_after_free", &rec.write_after_free }, { "late_writes", &rec.late_writes },
		{ "dma_dropped", &rec.dma_dropped }, { "pin_longterm", &rec.pin_longterm },
		{ "pins", &rec.pins }, { "coherent_live", &rec.coherent_live },
		{ "sg_live", &rec.sg_live }, { "pinning", &rec.pinning },
		{ "master_at_free", &rec.master_at_free }, { "puts", &rec.puts },
		{ "irqs", &rec.irqs }, { "irqs_handled", &rec.irqs_handled }, { "irq_live", &rec.irq_live },
	};
	size_t i;

	if (!strcmp(what, "ring_value"))
		return rec.ring_value;
	if (!strcmp(what, "bus_master"))
		return bus_master;
	if (!strcmp(what, "warns"))
		return warns;
	for (i = 0; i < sizeof(counters) / sizeof(counters[0]); i++)
		if (!strcmp(counters[i].name, what))
			return __atomic_load_n(counters[i].field, __ATOMIC_SEQ_CST);
	abort();
}

void h_desc(int i, u64 *src, u64 *dst, u32 *len)
{
	*src = rec.desc[i].src;
	*dst = rec.desc[i].dst;
	*len = rec.desc[i].len;
}

void h_map(int i, u64 *phys, u64 *size, u64 *dma)
{
	*phys = rec.map[i].phys;
	*size = rec.map[i].size;
	*dma = rec.map[i].dma;
}

/* module load with these parameters (NULL: unset) */
int h_load(char *w)
{
	windows = w;
	return h_module_init();
}

int h_selftest(void)
{
	return vca_dma_selftest(pci_get_drvdata(&pdevs[0]));
}

/* the last_copy sysfs attribute, as read() would give it */
int h_last_copy(char *buf)
{
	return dev_attr_last_copy.show(&pdevs[0].dev, &dev_attr_last_copy, buf);
}

/* vca_dma_parse_window() on a copy of @s */
int h_parse_window(const char *s, s32 *peer, u64 *bus_addr, u64 *len)
{
	struct vca_dma_win w = { 0 };
	char buf[128];
	int ret;

	snprintf(buf, sizeof(buf), "%s", s);
	ret = vca_dma_parse_window(buf, &w);
	*peer = w.peer;
	*bus_addr = w.bus_addr;
	*len = w.length;
	return ret;
}

/* vca_dma_win_phys() for the window bus_addr+len: 0 and *phys, or an error */
int h_win_phys(u64 bus_addr, u64 len, u64 *phys)
{
	struct vca_dma_win w = { 0, bus_addr, len };
	phys_addr_t p = 0;
	int ret = vca_dma_win_phys(&pdevs[0], &w, &p);

	*phys = p;
	return ret;
}

/* Split src/dst segment lists (addr, len pairs) as vca_dma_post() does: pieces into out (src, dst, len) */
int h_split(const u64 *src, int nsrc, const u64 *dst, int ndst, u64 *out, int max)
{
	struct vca_dma_seg s[64], t[64];
	struct vca_dma_cursor c = { .src = s, .dst = t, .nsrc = nsrc, .ndst = ndst };
	dma_addr_t a, b;
	u64 l;
	int i, n = 0;

	for (i = 0; i < nsrc; i++)
		s[i] = (struct vca_dma_seg){ src[2 * i], src[2 * i + 1] };
	for (i = 0; i < ndst; i++)
		t[i] = (struct vca_dma_seg){ dst[2 * i], dst[2 * i + 1] };
	while (n < max && (l = vca_dma_next_piece(&c, &a, &b))) {
		out[3 * n] = a;
		out[3 * n + 1] = b;
		out[3 * n + 2] = l;
		n++;
	}
	return n;
}

void h_unload(void)
{
	h_module_exit();
}

int h_probe(void)
{
	int ret = bound_drv->probe(&pdevs[0], NULL);

	if (ret)
		devres_release();
	else
		bound_dev = &pdevs[0];
	return ret;
}

struct file *h_open(int *err) { return misc_dev ? file_open(err) : (*err = -ENODEV, NULL); }
struct file *h_early_file(void) { return early_file; }

long h_ioctl(struct file *f, unsigned int cmd, void *arg)
{
	const struct file_operations *fops = &vca_dma_fops;

	return fops->unlocked_ioctl(f, cmd, (unsigned long)arg);
}

int h_release(struct file *f)
{
	static struct inode inode;
	int ret = vca_dma_fops.release(&inode, f);

	free(f);
	return ret;
}
