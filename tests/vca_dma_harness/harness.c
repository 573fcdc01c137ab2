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
	int cap, signal, hold, error, delay_us, open_on_register, map_fail, mbox, verbose;
} cfg;

static struct {
	struct h_desc desc[H_LOG_MAX];
	int ndesc;
	struct h_map map[VCA_DMA_MAX_WINDOWS];
	int nmap, nunmap;
	int regs_after_release, gone_at_deregister;
	int rings, ring_device;
	u32 ring_value;
} rec;

struct bus_type pci_bus_type;
static u32 regs[0x1000 / 4];
static void *ring_mem;
static bool released;
static struct pci_driver *bound_drv;
static struct pci_dev *bound_dev;
static struct miscdevice *misc_dev;
static struct file *early_file;
static pthread_mutex_t eng_mx = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t eng_cv = PTHREAD_COND_INITIALIZER;
static int eng_kick, eng_abort;
static unsigned int eng_idx;
static pthread_t eng_thread;
static bool eng_started;

/* The engine function, a PLX NT function whose BAR 2 holds A-LUT windows, and a NIC. */
static struct pci_dev pdevs[] = {
	{ .vendor = 0x10b5, .device = 0x87d0, .name = "0000:03:00.1", .driver_override = "vca_dma",
	  .resource = { [0] = { 0xf0000000, 0xf001ffff, IORESOURCE_MEM } } },
	{ .vendor = 0x10b5, .device = 0x87b0, .name = "0000:04:00.0",
	  .resource = { [0] = { 0xf1000000, 0xf103ffff, IORESOURCE_MEM },
			[2] = { 0x3800000000, 0x380fffffff, IORESOURCE_MEM } } },
	{ .vendor = 0x8086, .device = 0x1533, .name = "0000:05:00.0",
	  .resource = { [0] = { 0x4000000000, 0x400fffffff, IORESOURCE_MEM } } },
};

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

/* ---- registers and the engine thread ---- */

static u32 *reg(const void *addr)
{
	if (released)
		rec.regs_after_release++;
	return (u32 *)addr;
}

u32 ioread32(const void *addr)
{
	return __atomic_load_n(reg(addr), __ATOMIC_SEQ_CST);
}

void iowrite32(u32 val, void *addr)
{
	u32 off = (u32)((u8 *)reg(addr) - (u8 *)regs) - VCA_DMA_CHAN_BASE;

	pthread_mutex_lock(&eng_mx);
	if (off == VCA_DMA_CTRL && (val & VCA_DMA_CTRL_ABORT)) {
		eng_abort = 1;
		val = VCA_DMA_CTRL_ABORT_DONE;
	} else if (off == VCA_DMA_CTRL && (val & VCA_DMA_CTRL_START)) {
		eng_kick = 1;
		eng_abort = 0;
		val = VCA_DMA_CTRL_IN_PROGRESS;
	} else if (off == VCA_DMA_NEXT_DESC_LO) {
		eng_idx = 0;
	}
	__atomic_store_n((u32 *)addr, val, __ATOMIC_SEQ_CST);
	pthread_cond_broadcast(&eng_cv);
	pthread_mutex_unlock(&eng_mx);
}

static u32 chan_reg(u32 off)
{
	return regs[(VCA_DMA_CHAN_BASE + off) / 4];
}

/* Sleep delay_us, and on while held; false if an abort came meanwhile. Engine lock held. */
static bool eng_work(void)
{
	struct timespec t;

	clock_gettime(CLOCK_REALTIME, &t);
	t.tv_nsec += (long)cfg.delay_us * 1000;
	t.tv_sec += t.tv_nsec / 1000000000;
	t.tv_nsec %= 1000000000;
	while (!eng_abort && pthread_cond_timedwait(&eng_cv, &eng_mx, &t) == 0)
		;
	while (!eng_abort && cfg.hold)
		pthread_cond_wait(&eng_cv, &eng_mx);
	return !eng_abort;
}

/* Complete descriptors in ring order, VALID cleared last, as the engine does. */
static void *eng_main(void *arg)
{
	pthread_mutex_lock(&eng_mx);
	for (;;) {
		struct vca_dma_desc *ring;
		u32 *ctl, c;

		while (!eng_kick)
			pthread_cond_wait(&eng_cv, &eng_mx);
		ring = (void *)(uintptr_t)(((u64)chan_reg(VCA_DMA_RING_ADDR_HI) << 32) |
					   chan_reg(VCA_DMA_RING_ADDR_LO));
		ctl = (u32 *)&ring[eng_idx];		/* ctl_size is first */
		c = __atomic_load_n(ctl, __ATOMIC_SEQ_CST);
		if (!(c & VCA_DMA_DESC_VALID)) {
			eng_kick = 0;
			continue;
		}
		if (!eng_work()) {
			eng_kick = 0;
			continue;
		}
		if (rec.ndesc < H_LOG_MAX) {
			struct vca_dma_desc *d = &ring[eng_idx];
			u32 hi = d->addr_hi;

			rec.desc[rec.ndesc++] = (struct h_desc){
				((u64)(hi >> 16) << 32) | d->src_lo,
				((u64)(hi & 0xffff) << 32) | d->dst_lo,
				c & VCA_DMA_DESC_SIZE_MASK };
		}
		c &= ~VCA_DMA_DESC_VALID;
		if (cfg.error)
			c |= VCA_DMA_DESC_SRC_LINK_ERR;
		__atomic_store_n(ctl, c, __ATOMIC_SEQ_CST);
		eng_idx = (eng_idx + 1) % VCA_DMA_RING_LEN;
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

void *dmam_alloc_coherent(struct device *dev, size_t size, dma_addr_t *dma, gfp_t gfp)
{
	ring_mem = calloc(1, size);
	*dma = (uintptr_t)ring_mem;
	return ring_mem;
}

void *dma_alloc_coherent(struct device *dev, size_t size, dma_addr_t *dma, gfp_t gfp)
{
	void *p = calloc(1, size);

	*dma = (uintptr_t)p;
	return p;
}

void dma_free_coherent(struct device *dev, size_t size, void *cpu, dma_addr_t dma)
{
	free(cpu);
}

/* devres after probe failed or remove() returned: the ring is poisoned, the registers are gone */
static void devres_release(void)
{
	released = true;
	if (ring_mem)
		memset(ring_mem, 0xa5, sizeof(struct vca_dma_desc) * VCA_DMA_RING_LEN);
}

dma_addr_t dma_map_resource(struct device *dev, phys_addr_t phys, size_t size,
			    enum dma_data_direction dir, unsigned long attrs)
{
	if (cfg.map_fail == rec.nmap + 1)	/* map_fail: the Nth mapping fails */
		return DMA_MAPPING_ERROR;
	rec.map[rec.nmap] = (struct h_map){ phys, size, phys + H_IOVA_BASE };
	return rec.map[rec.nmap++].dma;
}

void dma_unmap_resource(struct device *dev, dma_addr_t addr, size_t size,
			enum dma_data_direction dir, unsigned long attrs)
{
	rec.nunmap++;
}

int device_create_file(struct device *dev, const struct device_attribute *attr) { return 0; }
void device_remove_file(struct device *dev, const struct device_attribute *attr) { }

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

/* plx_mbox, as the patched plx87xx exports it */
static struct plx_mbox { int id; } mboxes[16];
struct plx_mbox *plx_mbox_get(int id) { return id >= 0 && id < 16 ? &mboxes[id] : NULL; }
void plx_mbox_put(struct plx_mbox *mbox) { }
int plx_mbox_api_version(void) { return PLX_MBOX_API_VERSION; }
void plx_mbox_spad_write(struct plx_mbox *mbox, unsigned int idx, u32 val) { rec.ring_value = val; }

void plx_mbox_ring(struct plx_mbox *mbox, unsigned int db)
{
	rec.rings++;
	rec.ring_device = mbox - mboxes;
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
	eng_kick = 0;
	eng_abort = 1;		/* a held descriptor of the last test lets go */
	pthread_cond_broadcast(&eng_cv);
	memset(&cfg, 0, sizeof(cfg));
	memset(&rec, 0, sizeof(rec));
	pthread_mutex_unlock(&eng_mx);
	cfg.cap = 1;
	cfg.mbox = 1;
	cfg.verbose = !!getenv("VCA_HARNESS_VERBOSE");
	released = false;
	early_file = NULL;
	ring_mem = NULL;
	n_win = 0;
	fault_mask = 0;
	memset(win, 0, sizeof(win));
	memset(regs, 0, sizeof(regs));
}

void h_set(const char *what, int value)
{
	int *field = !strcmp(what, "cap") ? &cfg.cap : !strcmp(what, "signal") ? &cfg.signal :
		!strcmp(what, "hold") ? &cfg.hold : !strcmp(what, "error") ? &cfg.error :
		!strcmp(what, "delay_us") ? &cfg.delay_us :
		!strcmp(what, "open_on_register") ? &cfg.open_on_register :
		!strcmp(what, "map_fail") ? &cfg.map_fail :
		!strcmp(what, "mbox") ? &cfg.mbox : NULL;

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
	return !strcmp(what, "ndesc") ? rec.ndesc : !strcmp(what, "nmap") ? rec.nmap :
		!strcmp(what, "nunmap") ? rec.nunmap :
		!strcmp(what, "regs_after_release") ? rec.regs_after_release :
		!strcmp(what, "gone_at_deregister") ? rec.gone_at_deregister :
		!strcmp(what, "rings") ? rec.rings :
		!strcmp(what, "ring_device") ? rec.ring_device :
		!strcmp(what, "ring_value") ? (long long)rec.ring_value : -999999;
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
int h_load(char *w, char *f)
{
	windows = w;
	fault = f;
	return h_module_init();
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
