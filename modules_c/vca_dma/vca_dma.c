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
#include <linux/interrupt.h>
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
#include <linux/wait.h>
#include <linux/capability.h>

#include "plx_mbox.h"
#include "vca_dma_ioctl.h"
#include "vca_dma_regs.h"

/* plx_dma upstream runs a ring of 2048; 1024 keeps it in 16 KiB. */
#define VCA_DMA_RING_LEN	1024
#define VCA_DMA_RING_BYTES	(sizeof(struct vca_dma_desc) * VCA_DMA_RING_LEN)
#define VCA_DMA_SELFTEST_TIMEOUT_MS	200
#define VCA_DMA_ABORT_TIMEOUT_US	10000
#define VCA_DMA_ABORT_POLL_US		50
/* WAIT without an interrupt: spin for a copy's first ms, then sleep this long (lock dropped) */
#define VCA_DMA_POLL_US		10
/* WAIT with one: sleep until it comes, looking anyway this often in case one is lost */
#define VCA_DMA_IRQ_FALLBACK_MS	10
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

static unsigned int doorbell_spad = 7;
module_param(doorbell_spad, uint, 0444);
MODULE_PARM_DESC(doorbell_spad, "scratchpad written before a DOORBELL (default 7, as vca_mbox)");

static unsigned int doorbell = 15;
module_param(doorbell, uint, 0444);
MODULE_PARM_DESC(doorbell, "doorbell rung by DOORBELL (default 15, as vca_mbox)");

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
	struct vca_dma_desc *ring;	/* kept for good if the engine wedges */
	dma_addr_t ring_dma;
	unsigned int head;
	u32 ctrl_cfg;			/* CTRL bits 29:13 as the firmware set them */
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
	int irq;			/* the MSI's number, or 0: polled */
	wait_queue_head_t wq;		/* WAIT sleeps here; the interrupt and remove() wake it */
	atomic_t events;		/* bumped with every wake-up */
	atomic_t irq_status;		/* INTR status the interrupt acked since ring_init */
	atomic64_t submitted, completed, bytes, errors, timeouts, doorbells;
	u64 last_selftest_mibps;
	int last_selftest_result;
	struct vca_dma_last {		/* the last copy that ended, as the engine left it */
		u64 cookie, bytes;
		int status;
		unsigned int n;
		u32 first_wb, last_wb, ctrl, intr;
	} last;
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

/* A register that reads all ones: the function did not answer (link down, surprise removal). */
static bool vca_dma_no_answer(u32 v)
{
	return v == ~0U;
}

/*
 * Every CTRL write: the firmware's bits 29:13 kept, write-back on, descriptors
 * off-chip, plus @bits (Intel plx_dma.c:186-193 builds this value once and
 * writes it for every command; Linux writes PLX_REG_CTRL_START_VAL, which has
 * write-back on, as a 16-bit write that leaves bits 31:16 alone).
 */
static void vca_dma_ctrl(struct vca_dma *d, u32 bits)
{
	chan_write(d, VCA_DMA_CTRL, d->ctrl_cfg | VCA_DMA_CTRL_WB_ENABLE |
		   VCA_DMA_CTRL_OFFCHIP_MODE | bits);
}

/* The channel idle: an empty ring at index 0, every latched status bit acknowledged. */
static void vca_dma_ring_init(struct vca_dma *d)
{
	u32 intr;

	memset(d->ring, 0, VCA_DMA_RING_BYTES);
	d->head = 0;
	/* ack CTRL's status bits (write 1 to clear), as Intel plx_dma.c:196-199 enables it */
	vca_dma_ctrl(d, VCA_DMA_CTRL_STATUS_W1C);
	/* the ring, as Intel plx_dma_chan_set_desc_ring() (plx_dma.c:220-233) */
	chan_write(d, VCA_DMA_RING_ADDR_LO, lower_32_bits(d->ring_dma));
	chan_write(d, VCA_DMA_RING_ADDR_HI, upper_32_bits(d->ring_dma));
	chan_write(d, VCA_DMA_RING_SIZE, VCA_DMA_RING_LEN);
	chan_write(d, VCA_DMA_NEXT_DESC_LO, lower_32_bits(d->ring_dma));
	/*
	 * The status bits read written back to clear them (Intel
	 * plx_dma_ack_interrupt(), plx_dma.c:668-673; Linux plx_dma_isr() writes
	 * back what it read the same way); with an MSI, the error and invalid
	 * descriptor interrupts on (Intel enables error and abort-done, 210-218),
	 * the copy's own end comes from its last descriptor's INTR flag (Linux
	 * PLX_DESC_FLAG_INT_WHEN_DONE); polled, every enable off.
	 */
	intr = chan_read(d, VCA_DMA_INTR);
	if (!vca_dma_no_answer(intr))
		chan_write(d, VCA_DMA_INTR, (intr & VCA_DMA_INTR_STATUS_MASK) |
			   (d->irq ? VCA_DMA_INTR_ERROR_EN | VCA_DMA_INTR_INVALID_EN : 0));
	atomic_set(&d->irq_status, 0);
}

/*
 * Stop the channel; false if the engine never said the abort was done. Lock
 * held; it sleeps between reads. Neither reference driver aborts (both pause
 * gracefully, then tear the ring down): ABORT and ABORT_DONE are the bits
 * both define (PLX_DMA_CTRL_ABORT, PLX_DMA_CTRL_ABORT_DONE_STATUS).
 */
static bool vca_dma_abort(struct vca_dma *d)
{
	unsigned int us;
	u32 ctrl = chan_read(d, VCA_DMA_CTRL);

	/* a channel that stopped by itself (an error) needs no abort, may never report one */
	if (!vca_dma_no_answer(ctrl) && !(ctrl & VCA_DMA_CTRL_IN_PROGRESS)) {
		vca_dma_ring_init(d);
		return true;
	}
	vca_dma_ctrl(d, VCA_DMA_CTRL_ABORT);
	for (us = 0; us < VCA_DMA_ABORT_TIMEOUT_US; us += VCA_DMA_ABORT_POLL_US) {
		ctrl = chan_read(d, VCA_DMA_CTRL);
		if (!vca_dma_no_answer(ctrl) && (ctrl & VCA_DMA_CTRL_ABORT_DONE) &&
		    !(ctrl & VCA_DMA_CTRL_IN_PROGRESS)) {
			vca_dma_ring_init(d);
			return true;
		}
		usleep_range(VCA_DMA_ABORT_POLL_US, 2 * VCA_DMA_ABORT_POLL_US);
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

/* Unpin and free a copy that is no longer in flight (no lock held: unpinning may sleep). */
static void vca_dma_xfer_free(struct vca_dma *d, struct vca_dma_xfer *x)
{
	int i;

	if (!x)
		return;
	for (i = 0; i < x->npins; i++)
		vca_dma_unpin(d, &x->pin[i]);
	kfree(x);
}

/*
 * 1: done, 0: in flight, -EIO: the engine failed it. bytes: what the engine
 * wrote back it moved. A finished descriptor has VALID cleared and either
 * WB_SUCCESS or a failure bit, its size field the bytes moved (Linux
 * plx_dma_process_desc(): residue = size - written-back size). While the copy
 * runs, a latched ERROR or INVALID status fails it (Intel plx_dma_thread_fn()
 * counts both as a hang); all ones is no answer, not status.
 */
static int vca_dma_poll(struct vca_dma *d, struct vca_dma_xfer *x, u64 *bytes)
{
	unsigned int i;
	u64 done = 0;
	u32 intr;
	int ret = 1;

	for (i = 0; i < x->n; i++) {
		struct vca_dma_desc *desc = &d->ring[(x->first + i) % VCA_DMA_RING_LEN];
		u32 ctl = le32_to_cpu(READ_ONCE(desc->ctl_size));

		if (ctl & VCA_DMA_DESC_VALID) {
			ret = 0;
			break;
		}
		done += ctl & VCA_DMA_DESC_SIZE_MASK;
		if (!(ctl & VCA_DMA_DESC_WB_SUCCESS)) {
			ret = -EIO;
			break;
		}
	}
	if (ret == 0) {
		intr = chan_read(d, VCA_DMA_INTR);
		if (vca_dma_no_answer(intr))
			intr = 0;
		intr |= atomic_read(&d->irq_status);	/* what the interrupt acked already */
		if (intr & (VCA_DMA_INTR_ERROR | VCA_DMA_INTR_INVALID))
			ret = -EIO;
	}
	if (ret > 0 && !x->done_real_ns) {
		x->t_done = ktime_get();
		x->done_real_ns = ktime_get_real_ns();
	}
	*bytes = done;
	return ret;
}

/* Note what the engine wrote back for the copy in flight, which ended with @st (lock held). */
static void vca_dma_note(struct vca_dma *d, int st, u64 done)
{
	struct vca_dma_xfer *x = d->cur;
	unsigned int last = (x->first + x->n - 1) % VCA_DMA_RING_LEN;

	d->last = (struct vca_dma_last){
		.cookie = x->cookie, .bytes = done, .status = st > 0 ? 0 : st ? -EIO : -EINPROGRESS,
		.n = x->n,
		.first_wb = le32_to_cpu(READ_ONCE(d->ring[x->first].ctl_size)),
		.last_wb = le32_to_cpu(READ_ONCE(d->ring[last].ctl_size)),
		.ctrl = chan_read(d, VCA_DMA_CTRL),
		/* with what the interrupt acknowledged meanwhile */
		.intr = chan_read(d, VCA_DMA_INTR) | atomic_read(&d->irq_status),
	};
}

/*
 * End the copy in flight (lock held) and hand it back for the caller to free
 * once the lock is dropped. If the engine may still be running, abort it
 * first; where the abort does not complete, the copy's pages stay pinned and
 * mapped for good (the engine may still write them), NULL is returned and the
 * engine takes no more copies.
 */
static struct vca_dma_xfer *vca_dma_finish(struct vca_dma *d, bool abort)
{
	struct vca_dma_xfer *x = d->cur;
	u64 done;

	if (!x)
		return NULL;
	/* an idle channel may never report ABORT_DONE: abort only what still runs */
	if (abort && vca_dma_poll(d, x, &done) > 0)
		abort = false;
	d->cur = NULL;
	if (abort && !vca_dma_abort(d)) {
		dev_err(&d->pdev->dev, "abort did not complete: engine disabled, %d buffers left pinned\n",
			x->npins);
		d->wedged = true;
		return NULL;	/* x leaks on purpose */
	}
	return x;
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
		/* with an MSI, the last descriptor interrupts when it is done */
		u32 flags = VCA_DMA_DESC_VALID | (d->irq && x->n + 1 == n ? VCA_DMA_DESC_INTR : 0);

		desc->addr_hi = cpu_to_le32(((upper_32_bits(s) & 0xffff) << 16) |
					    (upper_32_bits(t) & 0xffff));
		desc->dst_lo = cpu_to_le32(lower_32_bits(t));
		desc->src_lo = cpu_to_le32(lower_32_bits(s));
		/* VALID last: the engine may fetch the descriptor as soon as it is set. */
		dma_wmb();
		WRITE_ONCE(desc->ctl_size, cpu_to_le32(flags | (u32)l));
		x->len[x->n++] = l;
		d->head = (d->head + 1) % VCA_DMA_RING_LEN;
	}
	wmb();	/* descriptors in memory before the engine is started */
	x->t0 = ktime_get();
	x->start_real_ns = ktime_get_real_ns();
	/* START with every status bit acked: Intel plx_dma_issue_pending(), plx_dma.c:235-247 */
	vca_dma_ctrl(d, VCA_DMA_CTRL_STATUS_W1C | VCA_DMA_CTRL_START);
	d->cur = x;
	atomic64_inc(&d->submitted);
	return 0;
}

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

/* false once the engine is removed (or its probe failed). */
static bool vca_dma_alive(struct vca_dma *d)
{
	bool alive;

	mutex_lock(&d->lock);
	alive = !d->gone;
	mutex_unlock(&d->lock);
	return alive;
}

static int vca_dma_pin_user(struct vca_dma *d, struct vca_dma_pin *p, u64 addr, u64 len,
			    bool engine_writes)
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
	/* user space decides how long a copy stays in flight: a long-term pin */
	ret = pin_user_pages_fast(start, n, FOLL_LONGTERM | (engine_writes ? FOLL_WRITE : 0),
				  p->pages);
	if (ret < 0)
		return ret;
	p->npages = ret;
	if (ret != n)
		return -EFAULT;
	ret = sg_alloc_table_from_pages(&p->sgt, p->pages, n, off, len, GFP_KERNEL);
	if (ret)
		return ret;
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

/* Caller holds d->lock: the copy posted with the next cookie, or -ENODEV / -EBUSY. */
static int vca_dma_post_if_idle(struct vca_dma *d, struct vca_dma_xfer *x,
				const struct vca_dma_seg *src, int nsrc,
				const struct vca_dma_seg *dst, int ndst)
{
	if (d->gone || d->wedged)
		return -ENODEV;
	if (d->cur)
		return -EBUSY;
	x->cookie = ++d->next_cookie;
	return vca_dma_post(d, x, src, nsrc, dst, ndst);
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

	/*
	 * Pin and map without the lock: a fault may block for as long as user
	 * space likes (userfaultfd, FUSE, NFS), and release() and remove() must
	 * not wait for it. The engine's state is checked once the lock is taken.
	 */
	if (!vca_dma_alive(d)) {
		ret = -ENODEV;
		goto out_free;
	}
	x->npins = user_target ? 2 : 1;
	ret = vca_dma_pin_user(d, &x->pin[0], c.user_addr, c.length, !to_target);
	if (ret)
		goto out_free;
	if (user_target) {
		ret = vca_dma_pin_user(d, &x->pin[1], c.target_offset, c.length, to_target);
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

	mutex_lock(&d->lock);
	ret = to_target ? vca_dma_post_if_idle(d, x, useg, nu, tseg, nt) :
			  vca_dma_post_if_idle(d, x, tseg, nt, useg, nu);
	mutex_unlock(&d->lock);
	if (ret)
		goto out_free;
	c.cookie = x->cookie;
	/* the copy runs; a failed write-back leaves it for WAIT or release() */
	ret = vca_dma_put(u, &c, sizeof(c), usize);
	x = NULL;

out_free:
	vca_dma_xfer_free(d, x);
	kfree(useg);
	if (tseg != &wseg)
		kfree(tseg);
	return ret;
}

/* 0 if the copy in flight is @owner's @cookie (owner NULL: the self-test). Lock held. */
static int vca_dma_waited(struct vca_dma *d, struct file *owner, u64 cookie)
{
	if (d->gone)
		return -ENODEV;
	if (!d->cur || d->cur->owner != owner || d->cur->cookie != cookie)
		return -ENOENT;
	return 0;
}

/*
 * Poll until the copy ends, fails or timeout_ms passes; *st is the last
 * poll's answer. The lock is held only to look, never across a sleep, so
 * SUBMIT from another file answers -EBUSY and release() and remove() go
 * through (the copy or the engine is then gone: -ENOENT, -ENODEV). Called
 * and returns with the lock held.
 */
static int vca_dma_wait_poll(struct vca_dma *d, struct file *owner, u64 cookie, u32 timeout_ms,
			     int *st, u64 *done)
{
	ktime_t end = ktime_add_ms(ktime_get(), timeout_ms);
	long left, fallback = msecs_to_jiffies(VCA_DMA_IRQ_FALLBACK_MS);
	bool spin;
	int ret, seq;

	for (;;) {
		ret = vca_dma_waited(d, owner, cookie);
		if (ret)
			return ret;
		seq = atomic_read(&d->events);
		*st = vca_dma_poll(d, d->cur, done);
		if (*st || !timeout_ms || !ktime_before(ktime_get(), end))
			return 0;
		spin = !d->irq && ktime_us_delta(ktime_get(), d->cur->t0) < 1000;
		mutex_unlock(&d->lock);
		if (signal_pending(current)) {
			mutex_lock(&d->lock);
			return -EINTR;	/* the copy stays in flight: WAIT again */
		}
		if (d->irq) {
			left = wait_event_interruptible_timeout(d->wq,
								atomic_read(&d->events) != seq,
								fallback);
			if (left < 0) {
				mutex_lock(&d->lock);
				return -EINTR;
			}
		} else if (spin) {
			udelay(1);
		} else {
			usleep_range(VCA_DMA_POLL_US, 2 * VCA_DMA_POLL_US);
		}
		mutex_lock(&d->lock);
	}
}

/*
 * Copy random data between two host buffers through the engine and compare
 * every byte. It waits as WAIT does, without the lock across a sleep.
 */
static int vca_dma_selftest(struct vca_dma *d)
{
	struct device *dev = &d->pdev->dev;
	size_t len = selftest_bytes;
	struct vca_dma_xfer *x, *end = NULL;
	struct vca_dma_seg s, t;
	dma_addr_t src_dma, dst_dma;
	void *src, *dst;
	bool keep = false;
	u64 done, cookie = 0;
	s64 ns = 0;
	int ret, st = 0;

	if (!len || len > VCA_DMA_DESC_MAX || len % 4)
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
	ret = vca_dma_post_if_idle(d, x, &s, 1, &t, 1);
	if (!ret) {
		cookie = x->cookie;
		x = NULL;	/* d->cur owns it now */
		ret = vca_dma_wait_poll(d, NULL, cookie, VCA_DMA_SELFTEST_TIMEOUT_MS, &st,
					&done);
		if (!ret) {
			ns = ktime_to_ns(ktime_sub(st > 0 ? d->cur->t_done : ktime_get(),
						   d->cur->t0));
			vca_dma_note(d, st, done);
			if (st == 0) {
				atomic64_inc(&d->timeouts);
				ret = -ETIMEDOUT;
			} else if (st < 0 || done != len) {
				atomic64_inc(&d->errors);
				ret = -EIO;
			} else {
				atomic64_inc(&d->completed);
				atomic64_add(len, &d->bytes);
			}
			end = vca_dma_finish(d, ret != 0);
		} else if (ret == -EINTR) {
			end = vca_dma_finish(d, true);
		}
		/* a wedged engine may still write dst (and read src): keep both */
		keep = d->wedged;
	}
	mutex_unlock(&d->lock);
	vca_dma_xfer_free(d, end);

	if (!ret && memcmp(src, dst, len))
		ret = -EILSEQ;		/* timed, but the data did not land: no figure */
	d->last_selftest_mibps = (!ret && ns > 0) ?
		div64_u64((u64)len * 1000000000ULL, (u64)ns << 20) : 0;
out:
	kfree(x);
	if (src && !keep)
		dma_free_coherent(dev, len, src, src_dma);
	if (dst && !keep)
		dma_free_coherent(dev, len, dst, dst_dma);
	d->last_selftest_result = ret;
	return ret;
}

static long vca_dma_ioc_wait(struct vca_dma *d, struct file *file, void __user *u)
{
	struct vca_dma_xfer *x, *end = NULL;
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
	ret = vca_dma_wait_poll(d, file, w.cookie, w.timeout_ms, &st, &done);
	if (ret)
		goto out;
	x = d->cur;
	w.bytes_done = done;
	w.elapsed_ns = ktime_to_ns(ktime_sub(st > 0 ? x->t_done : ktime_get(), x->t0));
	w.start_real_ns = x->start_real_ns;
	w.done_real_ns = x->done_real_ns;
	if (st || w.timeout_ms)
		vca_dma_note(d, st, done);
	if (st > 0) {
		w.status = 0;
		atomic64_inc(&d->completed);
		atomic64_add(done, &d->bytes);
		end = vca_dma_finish(d, false);
	} else if (st < 0) {
		w.status = -EIO;
		atomic64_inc(&d->errors);
		end = vca_dma_finish(d, true);
	} else {
		w.status = -EINPROGRESS;
		if (w.timeout_ms) {
			atomic64_inc(&d->timeouts);
			end = vca_dma_finish(d, true);
		}
	}
out:
	mutex_unlock(&d->lock);
	vca_dma_xfer_free(d, end);
	return ret ? ret : vca_dma_put(u, &w, sizeof(w), usize);
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
		dev_warn_ratelimited(&d->pdev->dev,
				     "DOORBELL: plx87xx has no plx_mbox API (load a patched plx87xx)\n");
		ret = -ENODEV;
	} else if (version() != PLX_MBOX_API_VERSION) {
		dev_warn_ratelimited(&d->pdev->dev, "DOORBELL: plx_mbox API version %d, expected %d\n",
				     version(), PLX_MBOX_API_VERSION);
		ret = -ENODEV;
	} else {
		/* a reference: plx87xx's data stays alive until put(), ops fail once it unbinds */
		mbox = get(b.device);
		if (!mbox) {
			ret = -ENODEV;
		} else {
			ret = write(mbox, doorbell_spad, b.value);
			if (!ret)
				ret = ring(mbox, doorbell);
			put(mbox);
			if (!ret)
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
		i.flags = 0;
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
	struct vca_dma_xfer *x = NULL;

	mutex_lock(&d->lock);
	if (d->cur && d->cur->owner == file)
		x = vca_dma_finish(d, true);
	mutex_unlock(&d->lock);
	vca_dma_xfer_free(d, x);
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

/* The last copy that ended: its write-back words and the channel's registers then (evidence). */
static ssize_t last_copy_show(struct device *dev, struct device_attribute *attr, char *buf)
{
	struct vca_dma *d = dev_get_drvdata(dev);
	struct vca_dma_last l;

	mutex_lock(&d->lock);
	l = d->last;
	mutex_unlock(&d->lock);
	if (!l.cookie)
		return sysfs_emit(buf, "none\n");
	return sysfs_emit(buf,
			  "cookie=%llu status=%d bytes=%llu descriptors=%u first_wb=%#010x last_wb=%#010x ctrl=%#010x intr=%#010x\n",
			  l.cookie, l.status, l.bytes, l.n, l.first_wb, l.last_wb, l.ctrl, l.intr);
}
static DEVICE_ATTR_RO(last_copy);

static struct attribute *vca_dma_attrs[] = {
	&dev_attr_selftest.attr,
	&dev_attr_last_copy.attr,
	NULL,
};
ATTRIBUTE_GROUPS(vca_dma);

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
 * Is @sib behind the switch this engine belongs to? The engine is a function
 * of the switch's upstream port (Linux plx_dma binds device 0x87D0, a
 * function of the PEX87xx upstream port), so a function of the same switch
 * is in that slot or has a bridge in it above it.
 */
static bool vca_dma_same_switch(struct pci_dev *engine, struct pci_dev *sib)
{
	struct pci_dev *up;

	for (up = sib; up; up = pci_upstream_bridge(up))
		if (up->bus == engine->bus && PCI_SLOT(up->devfn) == PCI_SLOT(engine->devfn))
			return true;
	return false;
}

/*
 * The CPU address of window @w if it lies inside one assigned memory BAR of
 * a PLX function of this engine's switch other than the engine itself (the
 * NT port BARs hold the A-LUT windows); a windows= entry pointing anywhere
 * else is refused.
 */
static int vca_dma_win_phys(struct pci_dev *pdev, const struct vca_dma_win *w, phys_addr_t *phys)
{
	struct pci_dev *sib = NULL;
	int bar;

	while ((sib = pci_get_device(pdev->vendor, PCI_ANY_ID, sib))) {
		if (sib == pdev || !vca_dma_same_switch(pdev, sib))
			continue;
		for (bar = 0; bar < PCI_STD_NUM_BARS; bar++) {
			unsigned long flags = pci_resource_flags(sib, bar);
			u64 bus = pci_bus_address(sib, bar), len = pci_resource_len(sib, bar);

			if (!(flags & IORESOURCE_MEM) || (flags & IORESOURCE_UNSET) || !len ||
			    w->bus_addr < bus || w->bus_addr - bus >= len ||
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

/*
 * No copy from now on: files still open answer -ENODEV. Before any of d is
 * freed. Returns the copy that was in flight, for the caller to free.
 */
static struct vca_dma_xfer *vca_dma_kill(struct vca_dma *d)
{
	struct vca_dma_xfer *x;

	mutex_lock(&d->lock);
	d->gone = true;
	atomic_inc(&d->events);
	wake_up(&d->wq);		/* a sleeping WAIT sees gone now, not at its next look */
	x = vca_dma_finish(d, true);
	if (!d->wedged) {
		/* idle ring torn down (Intel plx_dma_chan_clear_desc_ring, Linux __plx_dma_stop) */
		chan_write(d, VCA_DMA_RING_SIZE, 0);
		chan_write(d, VCA_DMA_RING_ADDR_LO, 0);
		chan_write(d, VCA_DMA_RING_ADDR_HI, 0);
		chan_write(d, VCA_DMA_NEXT_DESC_LO, 0);
	}
	mutex_unlock(&d->lock);
	return x;
}

/*
 * Hand back what the engine could write: bus mastering goes off first, so a
 * wedged engine can reach no memory at all; then the ring and the window
 * mappings are freed, or, where the engine wedged, kept for good (with the
 * pages of the copy it held) in case the function is ever enabled again.
 */
static void vca_dma_release_memory(struct vca_dma *d)
{
	struct pci_dev *pdev = d->pdev;
	u16 cmd = 0;

	pci_clear_master(pdev);
	pci_read_config_word(pdev, PCI_COMMAND, &cmd);
	WARN(cmd & PCI_COMMAND_MASTER, "vca_dma %s: bus mastering still on before the ring is freed\n",
	     d->bdf);
	if (d->wedged) {
		dev_err(&pdev->dev, "vca_dma: engine wedged: bus mastering off, ring and %u windows kept for good\n",
			d->n_mapped);
		return;
	}
	vca_dma_unmap_windows(d);
	if (d->ring)
		dma_free_coherent(&pdev->dev, VCA_DMA_RING_BYTES, d->ring, d->ring_dma);
	d->ring = NULL;
}

/* The MSI: acknowledge what it reports, note errors for the poll, wake WAIT. */
static irqreturn_t vca_dma_isr(int irq, void *data)
{
	struct vca_dma *d = data;
	u32 intr = chan_read(d, VCA_DMA_INTR);

	if (vca_dma_no_answer(intr) || !(intr & VCA_DMA_INTR_STATUS_MASK))
		return IRQ_NONE;
	/* ack: write back what was read (Intel plx_dma.c:668-673, Linux plx_dma_isr()) */
	chan_write(d, VCA_DMA_INTR, intr);
	atomic_or(intr & VCA_DMA_INTR_STATUS_MASK, &d->irq_status);
	atomic_inc(&d->events);
	wake_up(&d->wq);
	return IRQ_HANDLED;
}

/* An MSI if the function has one; else d->irq stays 0 and WAIT polls. */
static void vca_dma_setup_irq(struct vca_dma *d)
{
	struct pci_dev *pdev = d->pdev;
	int irq;

	if (pci_alloc_irq_vectors(pdev, 1, 1, PCI_IRQ_MSI | PCI_IRQ_MSIX) < 1)
		return;
	irq = pci_irq_vector(pdev, 0);
	if (irq <= 0 || request_irq(irq, vca_dma_isr, 0, "vca_dma", d)) {
		pci_free_irq_vectors(pdev);
		return;
	}
	d->irq = irq;
}

static void vca_dma_free_irq(struct vca_dma *d)
{
	if (!d->irq)
		return;
	free_irq(d->irq, d);
	pci_free_irq_vectors(d->pdev);
	d->irq = 0;
}

/* CTRL's configuration bits, and the channel stopped if something left it running. */
static int vca_dma_take_engine(struct vca_dma *d)
{
	u32 ctrl = chan_read(d, VCA_DMA_CTRL);

	if (vca_dma_no_answer(ctrl)) {
		dev_warn(&d->pdev->dev, "vca_dma: engine registers read all ones: nothing answers, copies will time out\n");
		d->ctrl_cfg = 0;
		return 0;
	}
	/* bits 29:13 as the firmware set them, kept in every write (Intel plx_dma.c:185-186) */
	d->ctrl_cfg = ctrl & VCA_DMA_CTRL_CFG_MASK;
	if ((ctrl & VCA_DMA_CTRL_IN_PROGRESS) && !vca_dma_abort(d)) {
		dev_err(&d->pdev->dev, "vca_dma: engine left running and its abort did not complete, refusing\n");
		return -EBUSY;
	}
	return 0;
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
	init_waitqueue_head(&d->wq);
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
	/* not devres: a wedged engine's ring must outlive the binding */
	d->ring = dma_alloc_coherent(&pdev->dev, VCA_DMA_RING_BYTES, &d->ring_dma, GFP_KERNEL);
	if (!d->ring) {
		ret = -ENOMEM;
		goto err_put;
	}
	ret = vca_dma_take_engine(d);
	if (ret)
		goto err_unmap;
	pci_set_drvdata(pdev, d);
	vca_dma_setup_irq(d);
	vca_dma_ring_init(d);
	pci_set_master(pdev);
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
	/* last: once it is registered, files may open and copies start */
	ret = misc_register(&d->misc);
	if (ret)
		goto err_ida;
	dev_info(&pdev->dev, "vca_dma: /dev/%s, ring of %d descriptors at %pad, %u windows, ctrl config %#x, %s\n",
		 d->name, VCA_DMA_RING_LEN, &d->ring_dma, n_win, d->ctrl_cfg,
		 d->irq ? "MSI" : "polled");
	return 0;

err_ida:
	ida_free(&vca_dma_ida, d->id);
err_unmap:
	vca_dma_kill(d);
	vca_dma_free_irq(d);
	vca_dma_release_memory(d);
err_put:
	pci_set_drvdata(pdev, NULL);
	if (d->ring)
		dma_free_coherent(&pdev->dev, VCA_DMA_RING_BYTES, d->ring, d->ring_dma);
	kref_put(&d->ref, vca_dma_free);
	return ret;
}

static void vca_dma_remove(struct pci_dev *pdev)
{
	struct vca_dma *d = pci_get_drvdata(pdev);

	misc_deregister(&d->misc);
	vca_dma_xfer_free(d, vca_dma_kill(d));
	vca_dma_free_irq(d);
	vca_dma_release_memory(d);
	dev_info(&pdev->dev, "vca_dma: /dev/%s removed%s\n", d->name,
		 d->wedged ? " (engine wedged)" : "");
	ida_free(&vca_dma_ida, d->id);
	kref_put(&d->ref, vca_dma_free);
}

static struct pci_driver vca_dma_driver = {
	.name = "vca_dma",
	.id_table = NULL,	/* bound only through driver_override, see above */
	.probe = vca_dma_probe,
	.remove = vca_dma_remove,
	.driver = {
		.dev_groups = vca_dma_groups,
	},
};

/* ---- parameters ---- */

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
