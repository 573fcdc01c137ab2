// SPDX-License-Identifier: GPL-2.0
/*
 * vca_dma: driver for the PLX PEX87xx DMA engine on a VCA 2 card.
 *
 * It maps the engine's registers, owns a descriptor ring in coherent host
 * memory, and gives user space one character device per engine,
 * /dev/vca_dma<N> (ABI: include/uapi/vca_dma_ioctl.h). A copy pins the
 * caller's buffer for its length only; the other side is a second pinned
 * buffer or an A-LUT window given by the windows= parameter. A self-test
 * copies random data between two host buffers and checks every byte.
 *
 * plx87xx_dma binds the same functions, so this driver has no device table:
 * bind it on purpose, and only where plx87xx_dma is not loaded:
 *   echo vca_dma > /sys/bus/pci/devices/<bdf>/driver_override
 *   echo <bdf> > /sys/bus/pci/drivers_probe
 */
#include <linux/delay.h>
#include <linux/dma-mapping.h>
#include <linux/fs.h>
#include <linux/idr.h>
#include <linux/io.h>
#include <linux/kref.h>
#include <linux/ktime.h>
#include <linux/miscdevice.h>
#include <linux/mm.h>
#include <linux/module.h>
#include <linux/mutex.h>
#include <linux/overflow.h>
#include <linux/pci.h>
#include <linux/random.h>
#include <linux/scatterlist.h>
#include <linux/sched/signal.h>
#include <linux/slab.h>
#include <linux/string.h>
#include <linux/uaccess.h>
#include <linux/capability.h>

#include "plx_mbox.h"
#include "vca_dma_ioctl.h"
#include "vca_dma_regs.h"

/* plx_dma upstream runs a ring of 2048; 1024 keeps it in 16 KiB. */
#define VCA_DMA_RING_LEN	1024
#define VCA_DMA_SELFTEST_TIMEOUT_MS	200
#define VCA_DMA_ABORT_TIMEOUT_US	10000
/* WAIT's poll: spin for the first ms of a copy, then sleep this long (lock dropped) */
#define VCA_DMA_POLL_US		10
#define VCA_DMA_MAX_WINDOWS	16
#define VCA_DMA_MAX_NODE	15
#define VCA_DMA_ADDR_LIMIT	BIT_ULL(48)
/*
 * Worst case one descriptor per page on each side of a user-to-user copy:
 * 2 * (pages + 1) - 1 descriptors must fit the ring.
 */
#define VCA_DMA_MAX_PAGES	((VCA_DMA_RING_LEN - 1) / 2 - 1)
#define VCA_DMA_MAX_COPY	((u64)(VCA_DMA_MAX_PAGES - 1) * PAGE_SIZE)
/* the most one descriptor moves, kept a multiple of 4 */
#define VCA_DMA_DESC_MAX	((u64)VCA_DMA_DESC_SIZE_MASK & ~3ULL)

static unsigned int selftest_bytes = 1 << 20;
module_param(selftest_bytes, uint, 0644);
MODULE_PARM_DESC(selftest_bytes, "bytes copied by a self-test (default 1 MiB)");

static char *windows;
module_param(windows, charp, 0444);
MODULE_PARM_DESC(windows, "A-LUT windows: peer@busaddr+len[,...], peer 'host' or a node index");

static char *fault;
module_param(fault, charp, 0444);
MODULE_PARM_DESC(fault, "TEST ONLY: fail on purpose at ring_alloc,cdev,sysfs,pin,map,submit,wait_timeout");

static unsigned int doorbell_spad = 7;
module_param(doorbell_spad, uint, 0444);
MODULE_PARM_DESC(doorbell_spad, "scratchpad written before a DOORBELL (default 7, as vca_mbox)");

static unsigned int doorbell = 15;
module_param(doorbell, uint, 0444);
MODULE_PARM_DESC(doorbell, "doorbell rung by DOORBELL (default 15, as vca_mbox)");

enum vca_dma_fault {
	FAULT_RING_ALLOC,
	FAULT_CDEV,
	FAULT_SYSFS,
	FAULT_PIN,
	FAULT_MAP,
	FAULT_SUBMIT,
	FAULT_WAIT_TIMEOUT,
	FAULT_NR,
};

static const char * const fault_names[FAULT_NR] = {
	[FAULT_RING_ALLOC] = "ring_alloc",
	[FAULT_CDEV] = "cdev",
	[FAULT_SYSFS] = "sysfs",
	[FAULT_PIN] = "pin",
	[FAULT_MAP] = "map",
	[FAULT_SUBMIT] = "submit",
	[FAULT_WAIT_TIMEOUT] = "wait_timeout",
};

static unsigned long fault_mask;

static bool fault_at(enum vca_dma_fault site)
{
	return test_bit(site, &fault_mask);
}

struct vca_dma_win {
	s32 peer;
	u64 bus_addr;
	u64 length;
};

static struct vca_dma_win win[VCA_DMA_MAX_WINDOWS];
static unsigned int n_win;

static DEFINE_IDA(vca_dma_ida);

/* One pinned and mapped user buffer. */
struct vca_dma_pin {
	struct page **pages;
	int npages;
	struct sg_table sgt;
	bool mapped;
	enum dma_data_direction dir;
};

struct vca_dma_seg {
	dma_addr_t addr;
	u64 len;
};

struct vca_dma_xfer {
	struct file *owner;		/* NULL for the self-test */
	u64 cookie;
	unsigned int first;		/* ring index of the first descriptor */
	unsigned int n;			/* descriptors */
	u32 len[VCA_DMA_RING_LEN];
	ktime_t t0, t_done;		/* START written; the first poll that saw it done */
	u64 start_real_ns, done_real_ns;	/* the same two, CLOCK_REALTIME; 0: not done */
	struct vca_dma_pin pin[2];
	int npins;
};

struct vca_dma {
	struct kref ref;
	struct pci_dev *pdev;
	void __iomem *regs;
	struct vca_dma_desc *ring;
	dma_addr_t ring_dma;
	unsigned int head;
	struct mutex lock;		/* the ring, cur, gone; WAIT drops it to sleep */
	struct vca_dma_xfer *cur;	/* the copy in flight, one per engine */
	bool gone;			/* removed: files still open answer -ENODEV */
	dma_addr_t win_dma[VCA_DMA_MAX_WINDOWS];	/* win[] as mapped for this engine */
	unsigned int n_mapped;
	bool wedged;			/* an abort did not complete: pages left pinned */
	u64 next_cookie;
	int id;
	char name[20];		/* "vca_dma" and any int */
	char bdf[16];
	struct miscdevice misc;
	atomic64_t submitted, completed, bytes, errors, timeouts, doorbells;
	u64 last_selftest_mibps;
	int last_selftest_result;
};

static u32 chan_read(struct vca_dma *d, u32 reg)
{
	return ioread32(d->regs + VCA_DMA_CHAN_BASE + reg);
}

static void chan_write(struct vca_dma *d, u32 reg, u32 val)
{
	iowrite32(val, d->regs + VCA_DMA_CHAN_BASE + reg);
}

static void vca_dma_free(struct kref *ref)
{
	struct vca_dma *d = container_of(ref, struct vca_dma, ref);

	pci_dev_put(d->pdev);
	kfree(d);
}

static void vca_dma_ring_init(struct vca_dma *d)
{
	memset(d->ring, 0, sizeof(*d->ring) * VCA_DMA_RING_LEN);
	d->head = 0;
	chan_write(d, VCA_DMA_RING_ADDR_LO, lower_32_bits(d->ring_dma));
	chan_write(d, VCA_DMA_RING_ADDR_HI, upper_32_bits(d->ring_dma));
	chan_write(d, VCA_DMA_RING_SIZE, VCA_DMA_RING_LEN);
	chan_write(d, VCA_DMA_NEXT_DESC_LO, lower_32_bits(d->ring_dma));
	chan_write(d, VCA_DMA_INTR, 0);		/* polled: no interrupts */
}

/* Stop the channel; false if the engine never said the abort was done. */
static bool vca_dma_abort(struct vca_dma *d)
{
	int us;

	chan_write(d, VCA_DMA_CTRL, VCA_DMA_CTRL_ABORT);
	for (us = 0; us < VCA_DMA_ABORT_TIMEOUT_US; us++) {
		if (chan_read(d, VCA_DMA_CTRL) & VCA_DMA_CTRL_ABORT_DONE) {
			vca_dma_ring_init(d);
			return true;
		}
		udelay(1);
	}
	return false;
}

static void vca_dma_unpin(struct vca_dma *d, struct vca_dma_pin *p)
{
	if (p->mapped)
		dma_unmap_sgtable(&d->pdev->dev, &p->sgt, p->dir, 0);
	if (p->sgt.sgl)
		sg_free_table(&p->sgt);
	if (p->npages > 0)
		unpin_user_pages_dirty_lock(p->pages, p->npages, p->dir == DMA_FROM_DEVICE);
	kvfree(p->pages);
	memset(p, 0, sizeof(*p));
}

static void vca_dma_xfer_free(struct vca_dma *d, struct vca_dma_xfer *x)
{
	int i;

	for (i = 0; i < x->npins; i++)
		vca_dma_unpin(d, &x->pin[i]);
	kfree(x);
}

/* 1: done, 0: in flight, -EIO: the engine failed it. bytes: what completed. */
static int vca_dma_poll(struct vca_dma *d, struct vca_dma_xfer *x, u64 *bytes)
{
	unsigned int i;
	u64 done = 0;
	int ret = 1;

	for (i = 0; i < x->n; i++) {
		struct vca_dma_desc *desc = &d->ring[(x->first + i) % VCA_DMA_RING_LEN];
		u32 ctl = le32_to_cpu(READ_ONCE(desc->ctl_size));

		if (ctl & VCA_DMA_DESC_VALID) {
			ret = 0;
			break;
		}
		if (ctl & (VCA_DMA_DESC_SRC_LINK_ERR | VCA_DMA_DESC_DST_LINK_ERR)) {
			ret = -EIO;
			break;
		}
		done += x->len[i];
	}
	if (ret == 0 && (chan_read(d, VCA_DMA_INTR) & (VCA_DMA_INTR_ERROR | VCA_DMA_INTR_INVALID)))
		ret = -EIO;
	if (ret > 0 && !x->done_real_ns) {
		x->t_done = ktime_get();
		x->done_real_ns = ktime_get_real_ns();
	}
	*bytes = done;
	return ret;
}

/*
 * End the copy in flight (lock held). If the engine may still be running,
 * abort it first; where the abort does not complete the pages stay pinned
 * and mapped for good (the engine may still write them) and the engine
 * takes no more copies.
 */
static void vca_dma_finish(struct vca_dma *d, bool abort)
{
	struct vca_dma_xfer *x = d->cur;
	u64 done;

	if (!x)
		return;
	/* an idle channel may never report ABORT_DONE: abort only what still runs */
	if (abort && vca_dma_poll(d, x, &done) > 0)
		abort = false;
	d->cur = NULL;
	if (abort && !vca_dma_abort(d)) {
		dev_err(&d->pdev->dev, "abort did not complete: engine disabled, %d buffers left pinned\n",
			x->npins);
		d->wedged = true;
		return;		/* x leaks on purpose */
	}
	vca_dma_xfer_free(d, x);
}

/* Write one descriptor per piece, VALID last in each, then START. Lock held, ring idle. */
/* Walks two segment lists in step: each piece is contiguous on both sides and fits a descriptor. */
struct vca_dma_cursor {
	const struct vca_dma_seg *src, *dst;
	int nsrc, ndst, si, di;
	u64 so, dof;
};

static u64 vca_dma_next_piece(struct vca_dma_cursor *c, dma_addr_t *s, dma_addr_t *t)
{
	u64 l;

	if (c->si >= c->nsrc || c->di >= c->ndst)
		return 0;
	l = min3(c->src[c->si].len - c->so, c->dst[c->di].len - c->dof, VCA_DMA_DESC_MAX);
	*s = c->src[c->si].addr + c->so;
	*t = c->dst[c->di].addr + c->dof;
	c->so += l;
	c->dof += l;
	if (c->so == c->src[c->si].len) {
		c->si++;
		c->so = 0;
	}
	if (c->dof == c->dst[c->di].len) {
		c->di++;
		c->dof = 0;
	}
	return l;
}

static int vca_dma_post(struct vca_dma *d, struct vca_dma_xfer *x, const struct vca_dma_seg *src,
			int nsrc, const struct vca_dma_seg *dst, int ndst)
{
	const struct vca_dma_cursor start = { .src = src, .dst = dst, .nsrc = nsrc, .ndst = ndst };
	struct vca_dma_cursor c = start;
	unsigned int n = 0;
	dma_addr_t s, t;
	u64 l;

	/* Count first: nothing reaches the ring unless all of it fits. */
	while (vca_dma_next_piece(&c, &s, &t))
		if (++n > VCA_DMA_RING_LEN)
			return -E2BIG;
	x->first = d->head;
	x->n = 0;
	c = start;
	while ((l = vca_dma_next_piece(&c, &s, &t))) {
		struct vca_dma_desc *desc = &d->ring[d->head];

		desc->addr_hi = cpu_to_le32(((upper_32_bits(s) & 0xffff) << 16) |
					    (upper_32_bits(t) & 0xffff));
		desc->dst_lo = cpu_to_le32(lower_32_bits(t));
		desc->src_lo = cpu_to_le32(lower_32_bits(s));
		/* VALID last: the engine may fetch the descriptor as soon as it is set. */
		dma_wmb();
		WRITE_ONCE(desc->ctl_size, cpu_to_le32(VCA_DMA_DESC_VALID | (u32)l));
		x->len[x->n++] = l;
		d->head = (d->head + 1) % VCA_DMA_RING_LEN;
	}
	wmb();	/* descriptors in memory before the engine is started */
	x->t0 = ktime_get();
	x->start_real_ns = ktime_get_real_ns();
	chan_write(d, VCA_DMA_CTRL, VCA_DMA_CTRL_STATUS_W1C | VCA_DMA_CTRL_OFFCHIP_MODE |
		   VCA_DMA_CTRL_START);
	d->cur = x;
	atomic64_inc(&d->submitted);
	return 0;
}

/* Copy random data between two host buffers through the engine and compare every byte. */
static int vca_dma_selftest(struct vca_dma *d)
{
	struct device *dev = &d->pdev->dev;
	size_t len = selftest_bytes;
	struct vca_dma_seg s, t;
	struct vca_dma_xfer *x;
	dma_addr_t src_dma, dst_dma;
	void *src, *dst;
	u64 done;
	s64 ns = 0;
	int ret;

	if (!len || len > VCA_DMA_DESC_SIZE_MASK || len % 4)
		return -EINVAL;
	x = kzalloc(sizeof(*x), GFP_KERNEL);
	src = dma_alloc_coherent(dev, len, &src_dma, GFP_KERNEL);
	dst = dma_alloc_coherent(dev, len, &dst_dma, GFP_KERNEL);
	if (!x || !src || !dst) {
		ret = -ENOMEM;
		goto out;
	}
	get_random_bytes(src, len);
	memset(dst, 0, len);
	s = (struct vca_dma_seg){ src_dma, len };
	t = (struct vca_dma_seg){ dst_dma, len };

	mutex_lock(&d->lock);
	if (d->gone || d->wedged) {
		ret = -ENODEV;
	} else if (d->cur) {
		ret = -EBUSY;
	} else {
		ret = vca_dma_post(d, x, &s, 1, &t, 1);
		if (!ret) {
			ktime_t end = ktime_add_ms(x->t0, VCA_DMA_SELFTEST_TIMEOUT_MS);

			x = NULL;	/* d->cur owns it now */
			while ((ret = vca_dma_poll(d, d->cur, &done)) == 0 &&
			       ktime_before(ktime_get(), end))
				udelay(1);
			ns = ktime_to_ns(ktime_sub(ktime_get(), d->cur->t0));
			if (ret == 0) {
				atomic64_inc(&d->timeouts);
				ret = -ETIMEDOUT;
			} else if (ret < 0) {
				atomic64_inc(&d->errors);
			} else {
				atomic64_inc(&d->completed);
				atomic64_add(len, &d->bytes);
				ret = 0;
			}
			vca_dma_finish(d, ret != 0);
			/* a wedged engine may still write dst: do not free it */
			if (d->wedged)
				dst = NULL;
		}
	}
	mutex_unlock(&d->lock);

	if (!ret && memcmp(src, dst, len))
		ret = -EILSEQ;		/* timed, but the data did not land: no figure */
	d->last_selftest_mibps = (!ret && ns > 0) ?
		div64_u64((u64)len * 1000000000ULL, (u64)ns << 20) : 0;
out:
	kfree(x);
	if (src)
		dma_free_coherent(dev, len, src, src_dma);
	if (dst)
		dma_free_coherent(dev, len, dst, dst_dma);
	d->last_selftest_result = ret;
	return ret;
}

static ssize_t selftest_store(struct device *dev, struct device_attribute *attr, const char *buf,
			      size_t count)
{
	int ret = vca_dma_selftest(dev_get_drvdata(dev));

	return ret ? ret : count;
}

static ssize_t selftest_show(struct device *dev, struct device_attribute *attr, char *buf)
{
	struct vca_dma *d = dev_get_drvdata(dev);

	/* Reading reports the last result only; it never starts a transfer. */
	return sysfs_emit(buf, "result=%d mibps=%llu bytes=%u\n", d->last_selftest_result,
			  d->last_selftest_mibps, selftest_bytes);
}
static DEVICE_ATTR_RW(selftest);

/* ---- the character device ---- */

/* Read a versioned struct: the header's rule (copy_struct_from_user). */
static int vca_dma_get(void *k, size_t ksize, size_t v1, void __user *u, u32 *usize)
{
	u32 size;

	if (get_user(size, (u32 __user *)u))
		return -EFAULT;
	if (size < v1)
		return -EINVAL;
	if (size > PAGE_SIZE)
		return -E2BIG;
	*usize = size;
	return copy_struct_from_user(k, ksize, u, size);
}

static int vca_dma_put(void __user *u, const void *k, size_t ksize, u32 usize)
{
	return copy_to_user(u, k, min_t(size_t, ksize, usize)) ? -EFAULT : 0;
}

static int vca_dma_pin_user(struct vca_dma *d, struct vca_dma_pin *p, u64 addr, u64 len,
			    bool engine_writes, bool last)
{
	unsigned long start = addr & PAGE_MASK;
	unsigned int off = offset_in_page(addr);
	int n, ret;

	if (addr + len < addr || !access_ok(u64_to_user_ptr(addr), len))
		return -EFAULT;
	p->dir = engine_writes ? DMA_FROM_DEVICE : DMA_TO_DEVICE;
	n = DIV_ROUND_UP(off + len, PAGE_SIZE);
	p->pages = kvmalloc_array(n, sizeof(*p->pages), GFP_KERNEL);
	if (!p->pages)
		return -ENOMEM;
	ret = (last && fault_at(FAULT_PIN)) ? -EFAULT :
		pin_user_pages_fast(start, n, engine_writes ? FOLL_WRITE : 0, p->pages);
	if (ret < 0)
		return ret;
	p->npages = ret;
	if (ret != n)
		return -EFAULT;
	ret = sg_alloc_table_from_pages(&p->sgt, p->pages, n, off, len, GFP_KERNEL);
	if (ret)
		return ret;
	if (last && fault_at(FAULT_MAP))
		return -ENOMEM;
	ret = dma_map_sgtable(&d->pdev->dev, &p->sgt, p->dir, 0);
	if (ret)
		return ret;
	p->mapped = true;
	return 0;
}

static int vca_dma_segs(struct vca_dma_pin *p, struct vca_dma_seg **out)
{
	struct vca_dma_seg *s;
	struct scatterlist *sg;
	int i;

	s = kcalloc(p->sgt.nents, sizeof(*s), GFP_KERNEL);
	if (!s)
		return -ENOMEM;
	for_each_sgtable_dma_sg(&p->sgt, sg, i) {
		s[i].addr = sg_dma_address(sg);
		s[i].len = sg_dma_len(sg);
	}
	*out = s;
	return p->sgt.nents;
}

static long vca_dma_ioc_submit(struct vca_dma *d, struct file *file, void __user *u)
{
	struct vca_dma_seg *useg = NULL, *tseg = NULL, wseg;
	bool to_target, user_target;
	struct vca_dma_xfer *x;
	struct vca_dma_copy c;
	int nu, nt, ret;
	u32 usize;

	/* again here, not only at open(): a descriptor handed on does not carry the right */
	if (!capable(CAP_SYS_RAWIO))
		return -EPERM;
	ret = vca_dma_get(&c, sizeof(c), VCA_DMA_COPY_SIZE_V1, u, &usize);
	if (ret)
		return ret;
	if (c.flags != VCA_DMA_DIR_TO_TARGET && c.flags != VCA_DMA_DIR_FROM_TARGET)
		return -EINVAL;
	if (!c.length || c.length % 4 || c.length > VCA_DMA_MAX_COPY)
		return -EINVAL;
	to_target = c.flags == VCA_DMA_DIR_TO_TARGET;
	if (c.target_kind == VCA_DMA_TARGET_USER) {
		if (c.target_index)
			return -EINVAL;
		user_target = true;
	} else if (c.target_kind == VCA_DMA_TARGET_WINDOW) {
		u64 end;

		if (c.target_index >= n_win)
			return -EINVAL;
		if (check_add_overflow(c.target_offset, c.length, &end) ||
		    end > win[c.target_index].length)
			return -ERANGE;
		wseg.addr = d->win_dma[c.target_index] + c.target_offset;
		wseg.len = c.length;
		user_target = false;
	} else {
		return -EINVAL;
	}

	x = kzalloc(sizeof(*x), GFP_KERNEL);
	if (!x)
		return -ENOMEM;
	x->owner = file;

	mutex_lock(&d->lock);
	if (d->gone || d->wedged) {
		ret = -ENODEV;
		goto out_unlock;
	}
	if (d->cur) {
		ret = -EBUSY;
		goto out_unlock;
	}
	x->npins = user_target ? 2 : 1;
	ret = vca_dma_pin_user(d, &x->pin[0], c.user_addr, c.length, !to_target, !user_target);
	if (ret)
		goto out_free;
	if (user_target) {
		ret = vca_dma_pin_user(d, &x->pin[1], c.target_offset, c.length, to_target, true);
		if (ret)
			goto out_free;
	}
	nu = vca_dma_segs(&x->pin[0], &useg);
	if (nu < 0) {
		ret = nu;
		goto out_free;
	}
	if (user_target) {
		nt = vca_dma_segs(&x->pin[1], &tseg);
		if (nt < 0) {
			ret = nt;
			goto out_free;
		}
	} else {
		tseg = &wseg;
		nt = 1;
	}
	if (fault_at(FAULT_SUBMIT)) {
		ret = -EIO;
		goto out_free;
	}
	x->cookie = ++d->next_cookie;
	ret = to_target ? vca_dma_post(d, x, useg, nu, tseg, nt) :
			  vca_dma_post(d, x, tseg, nt, useg, nu);
	if (ret)
		goto out_free;
	c.cookie = x->cookie;
	x = NULL;
	ret = vca_dma_put(u, &c, sizeof(c), usize);
	/* the copy runs; a failed write-back leaves it for WAIT or release() */
	goto out_unlock;

out_free:
	vca_dma_xfer_free(d, x);
	x = NULL;
out_unlock:
	mutex_unlock(&d->lock);
	kfree(x);
	kfree(useg);
	if (tseg != &wseg)
		kfree(tseg);
	return ret;
}

/* 0 if the copy in flight is this file's @cookie. Lock held. */
static int vca_dma_waited(struct vca_dma *d, struct file *file, u64 cookie)
{
	if (d->gone)
		return -ENODEV;
	if (!d->cur || d->cur->owner != file || d->cur->cookie != cookie)
		return -ENOENT;
	return 0;
}

/*
 * Poll until the copy ends, fails or the timeout passes; *st is the last
 * poll's answer. The lock is held only to look, never across a sleep, so
 * SUBMIT from another file answers -EBUSY and release() and remove() go
 * through (the copy or the engine is then gone: -ENOENT, -ENODEV). Called
 * and returns with the lock held.
 */
static int vca_dma_wait_poll(struct vca_dma *d, struct file *file, const struct vca_dma_wait *w,
			     int *st, u64 *done)
{
	ktime_t end = ktime_add_ms(ktime_get(), w->timeout_ms);
	bool spin;
	int ret;

	for (;;) {
		ret = vca_dma_waited(d, file, w->cookie);
		if (ret)
			return ret;
		*st = vca_dma_poll(d, d->cur, done);
		if (*st || !w->timeout_ms || fault_at(FAULT_WAIT_TIMEOUT) ||
		    !ktime_before(ktime_get(), end))
			return 0;
		spin = ktime_us_delta(ktime_get(), d->cur->t0) < 1000;
		mutex_unlock(&d->lock);
		if (signal_pending(current)) {
			mutex_lock(&d->lock);
			return -EINTR;	/* the copy stays in flight: WAIT again */
		}
		if (spin)
			udelay(1);
		else
			usleep_range(VCA_DMA_POLL_US, 2 * VCA_DMA_POLL_US);
		mutex_lock(&d->lock);
	}
}

static long vca_dma_ioc_wait(struct vca_dma *d, struct file *file, void __user *u)
{
	struct vca_dma_xfer *x;
	struct vca_dma_wait w;
	u64 done = 0;
	u32 usize;
	int ret, st = 0;

	ret = vca_dma_get(&w, sizeof(w), VCA_DMA_WAIT_SIZE_V1, u, &usize);
	if (ret)
		return ret;
	if (w.timeout_ms > VCA_DMA_WAIT_MAX_MS)
		return -EINVAL;

	mutex_lock(&d->lock);
	ret = vca_dma_wait_poll(d, file, &w, &st, &done);
	if (ret)
		goto out;
	x = d->cur;
	w.bytes_done = done;
	w.elapsed_ns = ktime_to_ns(ktime_sub(st > 0 ? x->t_done : ktime_get(), x->t0));
	w.start_real_ns = x->start_real_ns;
	w.done_real_ns = x->done_real_ns;
	if (st > 0) {
		w.status = 0;
		atomic64_inc(&d->completed);
		atomic64_add(done, &d->bytes);
		vca_dma_finish(d, false);
	} else if (st < 0) {
		w.status = -EIO;
		atomic64_inc(&d->errors);
		vca_dma_finish(d, true);
	} else {
		w.status = -EINPROGRESS;
		if (w.timeout_ms) {
			atomic64_inc(&d->timeouts);
			vca_dma_finish(d, true);
		}
	}
	ret = vca_dma_put(u, &w, sizeof(w), usize);
out:
	mutex_unlock(&d->lock);
	return ret;
}

/* false once the engine is removed (or its probe failed). */
static bool vca_dma_alive(struct vca_dma *d)
{
	bool alive;

	mutex_lock(&d->lock);
	alive = !d->gone;
	mutex_unlock(&d->lock);
	return alive;
}

static long vca_dma_ioc_doorbell(struct vca_dma *d, void __user *u)
{
	typeof(plx_mbox_get) *get;
	typeof(plx_mbox_put) *put;
	typeof(plx_mbox_spad_write) *write;
	typeof(plx_mbox_ring) *ring;
	typeof(plx_mbox_api_version) *version;
	struct vca_dma_doorbell b;
	struct plx_mbox *mbox;
	u32 usize;
	int ret;

	if (!capable(CAP_SYS_RAWIO))
		return -EPERM;
	ret = vca_dma_get(&b, sizeof(b), VCA_DMA_DOORBELL_SIZE_V1, u, &usize);
	if (ret)
		return ret;
	/* 0 would read, to a peer polling the scratchpad, as no word posted */
	if (b.device < 0 || b.device > VCA_DMA_MAX_NODE || !b.value || b.reserved)
		return -EINVAL;
	if (!vca_dma_alive(d))
		return -ENODEV;
	get = symbol_get(plx_mbox_get);
	put = symbol_get(plx_mbox_put);
	write = symbol_get(plx_mbox_spad_write);
	ring = symbol_get(plx_mbox_ring);
	version = symbol_get(plx_mbox_api_version);
	if (!get || !put || !write || !ring || !version) {
		dev_warn(&d->pdev->dev, "DOORBELL: plx87xx has no plx_mbox API (load a patched plx87xx)\n");
		ret = -ENODEV;
	} else if (version() != PLX_MBOX_API_VERSION) {
		dev_warn(&d->pdev->dev, "DOORBELL: plx_mbox API version %d, expected %d\n",
			 version(), PLX_MBOX_API_VERSION);
		ret = -ENODEV;
	} else {
		mbox = get(b.device);
		if (!mbox) {
			ret = -ENODEV;
		} else {
			write(mbox, doorbell_spad, b.value);
			ring(mbox, doorbell);
			put(mbox);
			atomic64_inc(&d->doorbells);
		}
	}
	if (get)
		symbol_put(plx_mbox_get);
	if (put)
		symbol_put(plx_mbox_put);
	if (write)
		symbol_put(plx_mbox_spad_write);
	if (ring)
		symbol_put(plx_mbox_ring);
	if (version)
		symbol_put(plx_mbox_api_version);
	return ret;
}

static long vca_dma_ioctl(struct file *file, unsigned int cmd, unsigned long arg)
{
	struct vca_dma *d = file->private_data;
	void __user *u = (void __user *)arg;
	u32 usize;
	int ret;

	if (_IOC_TYPE(cmd) != VCA_DMA_MAGIC)
		return -ENOTTY;
	switch (_IOC_NR(cmd)) {
	case _IOC_NR(VCA_DMA_IOC_INFO): {
		struct vca_dma_info i;

		ret = vca_dma_get(&i, sizeof(i), VCA_DMA_INFO_SIZE_V1, u, &usize);
		if (ret)
			return ret;
		i.abi_version = VCA_DMA_ABI_VERSION;
		i.engine = d->id;
		i.ring_len = VCA_DMA_RING_LEN;
		i.max_copy_bytes = VCA_DMA_MAX_COPY;
		i.n_windows = n_win;
		i.flags = fault_mask ? VCA_DMA_INFO_FAULT_ARMED : 0;
		strscpy(i.bdf, d->bdf, sizeof(i.bdf));
		return vca_dma_put(u, &i, sizeof(i), usize);
	}
	case _IOC_NR(VCA_DMA_IOC_WINDOW): {
		struct vca_dma_window w;

		ret = vca_dma_get(&w, sizeof(w), VCA_DMA_WINDOW_SIZE_V1, u, &usize);
		if (ret)
			return ret;
		if (w.index >= n_win)
			return -EINVAL;
		w.peer = win[w.index].peer;
		w.flags = 0;
		w.bus_addr = win[w.index].bus_addr;
		w.length = win[w.index].length;
		return vca_dma_put(u, &w, sizeof(w), usize);
	}
	case _IOC_NR(VCA_DMA_IOC_SUBMIT):
		return vca_dma_ioc_submit(d, file, u);
	case _IOC_NR(VCA_DMA_IOC_WAIT):
		return vca_dma_ioc_wait(d, file, u);
	case _IOC_NR(VCA_DMA_IOC_COUNTERS): {
		struct vca_dma_counters c;

		ret = vca_dma_get(&c, sizeof(c), VCA_DMA_COUNTERS_SIZE_V1, u, &usize);
		if (ret)
			return ret;
		c.submitted = atomic64_read(&d->submitted);
		c.completed = atomic64_read(&d->completed);
		c.bytes = atomic64_read(&d->bytes);
		c.errors = atomic64_read(&d->errors);
		c.timeouts = atomic64_read(&d->timeouts);
		c.doorbells = atomic64_read(&d->doorbells);
		return vca_dma_put(u, &c, sizeof(c), usize);
	}
	case _IOC_NR(VCA_DMA_IOC_DOORBELL):
		return vca_dma_ioc_doorbell(d, u);
	default:
		return -ENOTTY;
	}
}

static int vca_dma_open(struct inode *inode, struct file *file)
{
	/* misc_open() holds misc_mtx here, and remove() deregisters under it first */
	struct vca_dma *d = container_of(file->private_data, struct vca_dma, misc);

	if (!capable(CAP_SYS_RAWIO))
		return -EPERM;
	kref_get(&d->ref);
	file->private_data = d;
	return nonseekable_open(inode, file);
}

static int vca_dma_release(struct inode *inode, struct file *file)
{
	struct vca_dma *d = file->private_data;

	mutex_lock(&d->lock);
	if (d->cur && d->cur->owner == file)
		vca_dma_finish(d, true);
	mutex_unlock(&d->lock);
	kref_put(&d->ref, vca_dma_free);
	return 0;
}

static const struct file_operations vca_dma_fops = {
	.owner = THIS_MODULE,
	.open = vca_dma_open,
	.release = vca_dma_release,
	.unlocked_ioctl = vca_dma_ioctl,
	.compat_ioctl = compat_ptr_ioctl,
};

/* ---- binding ---- */

static struct pci_driver vca_dma_driver;

/*
 * plx87xx_dma must not own this function. find_module() is not exported on
 * 6.x, so ask the driver core: is a PCI driver of that name registered?
 * Plus the function must have been handed to us by driver_override (the
 * device lock is held in probe), not caught by a new_id.
 */
static bool vca_dma_overridden(struct pci_dev *pdev)
{
	bool ours;

#ifdef VCA_DMA_DEVICE_DRIVER_OVERRIDE
	/* open-coded device_match_driver_override(): sparse cannot follow its guard() */
	spin_lock(&pdev->dev.driver_override.lock);
	ours = pdev->dev.driver_override.name &&
	       !strcmp(pdev->dev.driver_override.name, vca_dma_driver.name);
	spin_unlock(&pdev->dev.driver_override.lock);
#else
	ours = pdev->driver_override && !strcmp(pdev->driver_override, vca_dma_driver.name);
#endif
	return ours;
}

static int vca_dma_may_bind(struct pci_dev *pdev)
{
	if (pdev->dev.driver && pdev->dev.driver != &vca_dma_driver.driver) {
		dev_err(&pdev->dev, "vca_dma: bound to %s already, refusing\n",
			pdev->dev.driver->name);
		return -EBUSY;
	}
	if (driver_find("plx87xx_dma", &pci_bus_type)) {
		dev_err(&pdev->dev, "vca_dma: plx87xx_dma is loaded and owns PLX DMA functions, refusing; unload it first\n");
		return -EBUSY;
	}
	if (!vca_dma_overridden(pdev)) {
		dev_err(&pdev->dev, "vca_dma: bind only through driver_override=vca_dma, refusing\n");
		return -EBUSY;
	}
	return 0;
}

/*
 * The CPU address of window @w if it lies inside one memory BAR of a PLX
 * function other than this engine (the switch's NT port BARs hold the
 * A-LUT windows); a windows= entry pointing anywhere else is refused.
 */
static int vca_dma_win_phys(struct pci_dev *pdev, const struct vca_dma_win *w, phys_addr_t *phys)
{
	struct pci_dev *sib = NULL;
	int bar;

	while ((sib = pci_get_device(pdev->vendor, PCI_ANY_ID, sib))) {
		if (sib == pdev)
			continue;
		for (bar = 0; bar < PCI_STD_NUM_BARS; bar++) {
			u64 bus = pci_bus_address(sib, bar), len = pci_resource_len(sib, bar);

			if (!(pci_resource_flags(sib, bar) & IORESOURCE_MEM) ||
			    w->bus_addr < bus || w->bus_addr - bus > len ||
			    w->length > len - (w->bus_addr - bus))
				continue;
			*phys = pci_resource_start(sib, bar) + (w->bus_addr - bus);
			pci_dev_put(sib);
			return 0;
		}
	}
	return -EINVAL;
}

static void vca_dma_unmap_windows(struct vca_dma *d)
{
	unsigned int i;

	for (i = 0; i < d->n_mapped; i++)
		dma_unmap_resource(&d->pdev->dev, d->win_dma[i], win[i].length,
				   DMA_BIDIRECTIONAL, 0);
	d->n_mapped = 0;
}

/* Check every window against the switch's BARs and map it for this engine. */
static int vca_dma_map_windows(struct vca_dma *d)
{
	struct device *dev = &d->pdev->dev;
	phys_addr_t phys;
	unsigned int i;

	for (i = 0; i < n_win; i++) {
		if (vca_dma_win_phys(d->pdev, &win[i], &phys)) {
			dev_err(dev, "vca_dma: window %u (%#llx+%#llx) is in no BAR of a PLX function, refusing\n",
				i, win[i].bus_addr, win[i].length);
			return -EINVAL;
		}
		d->win_dma[i] = dma_map_resource(dev, phys, win[i].length, DMA_BIDIRECTIONAL, 0);
		if (dma_mapping_error(dev, d->win_dma[i]))
			return -ENOMEM;
		d->n_mapped++;
	}
	return 0;
}

/* No copy from now on: files still open answer -ENODEV. Before any of d is freed. */
static void vca_dma_kill(struct vca_dma *d)
{
	mutex_lock(&d->lock);
	d->gone = true;
	if (d->cur)
		vca_dma_finish(d, true);
	chan_write(d, VCA_DMA_CTRL, VCA_DMA_CTRL_ABORT);
	mutex_unlock(&d->lock);
}

static int vca_dma_probe(struct pci_dev *pdev, const struct pci_device_id *id)
{
	struct vca_dma *d;
	int ret;

	ret = vca_dma_may_bind(pdev);
	if (ret)
		return ret;
	d = kzalloc(sizeof(*d), GFP_KERNEL);
	if (!d)
		return -ENOMEM;
	kref_init(&d->ref);
	d->pdev = pci_dev_get(pdev);
	mutex_init(&d->lock);
	d->last_selftest_result = -ENODATA;
	strscpy(d->bdf, pci_name(pdev), sizeof(d->bdf));

	ret = pcim_enable_device(pdev);
	if (ret)
		goto err_put;
	ret = dma_set_mask_and_coherent(&pdev->dev, DMA_BIT_MASK(48));
	if (ret)
		goto err_put;
	d->regs = pcim_iomap(pdev, 0, 0);
	if (!d->regs) {
		ret = -ENOMEM;
		goto err_put;
	}
	pci_set_master(pdev);
	d->ring = fault_at(FAULT_RING_ALLOC) ? NULL :
		dmam_alloc_coherent(&pdev->dev, sizeof(*d->ring) * VCA_DMA_RING_LEN, &d->ring_dma,
				    GFP_KERNEL);
	if (!d->ring) {
		ret = -ENOMEM;
		goto err_put;
	}
	pci_set_drvdata(pdev, d);
	vca_dma_ring_init(d);
	ret = vca_dma_map_windows(d);
	if (ret)
		goto err_unmap;

	d->id = ida_alloc(&vca_dma_ida, GFP_KERNEL);
	if (d->id < 0) {
		ret = d->id;
		goto err_unmap;
	}
	snprintf(d->name, sizeof(d->name), "vca_dma%d", d->id);
	d->misc.minor = MISC_DYNAMIC_MINOR;
	d->misc.name = d->name;
	d->misc.fops = &vca_dma_fops;
	d->misc.mode = 0600;
	d->misc.parent = &pdev->dev;
	ret = fault_at(FAULT_CDEV) ? -EIO : misc_register(&d->misc);
	if (ret)
		goto err_ida;
	ret = fault_at(FAULT_SYSFS) ? -EIO : device_create_file(&pdev->dev, &dev_attr_selftest);
	if (ret)
		goto err_misc;
	dev_info(&pdev->dev, "vca_dma: /dev/%s, ring of %d descriptors at %pad, %u windows%s\n",
		 d->name, VCA_DMA_RING_LEN, &d->ring_dma, n_win,
		 fault_mask ? ", FAULTS ARMED" : "");
	return 0;

err_misc:
	/* a file may have opened /dev/vca_dma<N> already: it must see gone before the ring goes */
	vca_dma_kill(d);
	misc_deregister(&d->misc);
err_ida:
	ida_free(&vca_dma_ida, d->id);
err_unmap:
	vca_dma_unmap_windows(d);
err_put:
	pci_set_drvdata(pdev, NULL);
	kref_put(&d->ref, vca_dma_free);
	return ret;
}

static void vca_dma_remove(struct pci_dev *pdev)
{
	struct vca_dma *d = pci_get_drvdata(pdev);

	device_remove_file(&pdev->dev, &dev_attr_selftest);
	misc_deregister(&d->misc);
	vca_dma_kill(d);
	vca_dma_unmap_windows(d);
	ida_free(&vca_dma_ida, d->id);
	kref_put(&d->ref, vca_dma_free);
}

static struct pci_driver vca_dma_driver = {
	.name = "vca_dma",
	.id_table = NULL,	/* bound only through driver_override, see above */
	.probe = vca_dma_probe,
	.remove = vca_dma_remove,
};

/* ---- parameters ---- */

static int __init vca_dma_parse_fault(void)
{
	char *buf, *p, *tok;
	int i, ret = 0;

	if (!fault || !*fault)
		return 0;
	buf = kstrdup(fault, GFP_KERNEL);
	if (!buf)
		return -ENOMEM;
	p = buf;
	while ((tok = strsep(&p, ",")) != NULL) {
		i = match_string(fault_names, FAULT_NR, tok);
		if (i < 0) {
			pr_err("vca_dma: fault=%s: unknown site '%s'\n", fault, tok);
			ret = -EINVAL;
			break;
		}
		set_bit(i, &fault_mask);
	}
	kfree(buf);
	if (!ret)
		pr_warn("vca_dma: TEST ONLY fault sites armed: %s\n", fault);
	return ret;
}

/* peer@busaddr+len */
static int __init vca_dma_parse_window(char *tok, struct vca_dma_win *w)
{
	char *at = strchr(tok, '@'), *plus;
	u64 end;
	int node;

	if (!at)
		return -EINVAL;
	*at++ = '\0';
	plus = strchr(at, '+');
	if (!plus)
		return -EINVAL;
	*plus++ = '\0';
	if (!strcmp(tok, "host")) {
		w->peer = VCA_DMA_PEER_HOST;
	} else {
		if (kstrtoint(tok, 10, &node) || node < 0 || node > VCA_DMA_MAX_NODE)
			return -EINVAL;
		w->peer = node;
	}
	if (kstrtou64(at, 0, &w->bus_addr) || kstrtou64(plus, 0, &w->length))
		return -EINVAL;
	if (!w->length || w->bus_addr % 4 || w->length % 4 ||
	    check_add_overflow(w->bus_addr, w->length, &end) || end > VCA_DMA_ADDR_LIMIT)
		return -EINVAL;
	return 0;
}

static int __init vca_dma_parse_windows(void)
{
	char *buf, *p, *tok;
	int ret = 0;

	if (!windows || !*windows)
		return 0;
	buf = kstrdup(windows, GFP_KERNEL);
	if (!buf)
		return -ENOMEM;
	p = buf;
	while ((tok = strsep(&p, ",")) != NULL) {
		char entry[64];

		strscpy(entry, tok, sizeof(entry));
		if (n_win == VCA_DMA_MAX_WINDOWS) {
			pr_err("vca_dma: windows=: more than %d windows\n", VCA_DMA_MAX_WINDOWS);
			ret = -EINVAL;
			break;
		}
		if (vca_dma_parse_window(tok, &win[n_win])) {
			pr_err("vca_dma: windows=: bad entry '%s' (want peer@busaddr+len, peer 'host' or 0-%d, 4-byte aligned, below 2^48)\n",
			       entry, VCA_DMA_MAX_NODE);
			ret = -EINVAL;
			break;
		}
		n_win++;
	}
	kfree(buf);
	if (ret)
		n_win = 0;
	return ret;
}

static int __init vca_dma_init(void)
{
	int ret;

	if (doorbell_spad >= PLX_MBOX_NUM_SPADS || doorbell >= PLX_MBOX_NUM_DOORBELLS) {
		pr_err("vca_dma: doorbell_spad must be < %d and doorbell < %d\n",
		       PLX_MBOX_NUM_SPADS, PLX_MBOX_NUM_DOORBELLS);
		return -EINVAL;
	}
	ret = vca_dma_parse_fault();
	if (ret)
		return ret;
	ret = vca_dma_parse_windows();
	if (ret)
		return ret;
	return pci_register_driver(&vca_dma_driver);
}

static void __exit vca_dma_exit(void)
{
	pci_unregister_driver(&vca_dma_driver);
	ida_destroy(&vca_dma_ida);
}

module_init(vca_dma_init);
module_exit(vca_dma_exit);
MODULE_DESCRIPTION("vcafleet: PLX PEX87xx DMA engine, /dev/vca_dma<N> and a verified self-test");
MODULE_AUTHOR("vcafleet");
MODULE_LICENSE("GPL");
