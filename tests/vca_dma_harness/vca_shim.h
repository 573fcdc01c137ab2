/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The kernel, as far as vca_dma.c uses it, in user space: every linux/<x>.h
 * of include/ is this file. Locks are pthread mutexes, sleeps nanosleep, user
 * copies memcpy (the "user" is the same process); PCI, DMA mapping, misc
 * devices, devres and the engine's registers are fakes in harness.c that
 * record what the driver did. Only what vca_dma.c calls is here.
 */
#ifndef VCA_SHIM_H
#define VCA_SHIM_H

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <time.h>
#include <linux/types.h>	/* the system's uapi types: __u32, __le32 */
#include <linux/ioctl.h>

typedef __u8 u8;
typedef __u16 u16;
typedef __u32 u32;
typedef __u64 u64;
typedef __s32 s32;
typedef __s64 s64;
typedef u64 dma_addr_t;
typedef u64 phys_addr_t;
typedef u64 resource_size_t;
typedef u64 pci_bus_addr_t;
typedef unsigned int gfp_t;
typedef unsigned short umode_t;
typedef s64 ktime_t;

#define __user
#define __iomem
#define __init
#define __exit
#define __packed		__attribute__((packed))
#define GFP_KERNEL		0
#define BIT(n)			(1UL << (n))
#define BIT_ULL(n)		(1ULL << (n))
#define PAGE_SIZE		4096UL
#define PAGE_MASK		(~(PAGE_SIZE - 1))
#define offset_in_page(p)	((unsigned long)(p) & ~PAGE_MASK)
#define DIV_ROUND_UP(n, d)	(((n) + (d) - 1) / (d))
#define min(a, b)		((a) < (b) ? (a) : (b))
#define min_t(t, a, b)		min((t)(a), (t)(b))
#define min3(a, b, c)		min(min(a, b), c)
#define lower_32_bits(n)	((u32)((n) & 0xffffffff))
#define upper_32_bits(n)	((u32)((u64)(n) >> 32))
#define cpu_to_le32(x)		((__le32)(x))
#define le32_to_cpu(x)		((u32)(x))
#define READ_ONCE(x)		__atomic_load_n(&(x), __ATOMIC_ACQUIRE)
#define WRITE_ONCE(x, v)	__atomic_store_n(&(x), (v), __ATOMIC_RELEASE)
#define dma_wmb()		__sync_synchronize()
#define wmb()			__sync_synchronize()
#define container_of(p, t, m)	((t *)((char *)(p) - offsetof(t, m)))
#define check_add_overflow(a, b, d)	__builtin_add_overflow(a, b, d)
#define div64_u64(a, b)		((a) / (b))
#define DMA_BIT_MASK(n)		((1ULL << (n)) - 1)
#define typeof			__typeof__

/* module.h: parameters are plain statics the harness sets before h_load() */
#define module_param(n, t, p)	_Static_assert(1, #n)
#define MODULE_PARM_DESC(n, s)	_Static_assert(1, #n)
#define MODULE_DESCRIPTION(s)	_Static_assert(1, s)
#define MODULE_AUTHOR(s)	_Static_assert(1, s)
#define MODULE_LICENSE(s)	_Static_assert(1, s)
#define module_init(fn)		int h_module_init(void) { return fn(); }
#define module_exit(fn)		void h_module_exit(void) { fn(); }
#define THIS_MODULE		((struct module *)0)
#define symbol_get(x)		((typeof(&x))h_symbol_get(#x, (void *)&x))
#define symbol_put(x)		h_symbol_put(#x)
void *h_symbol_get(const char *name, void *fn);
void h_symbol_put(const char *name);

void h_log(const char *fmt, ...);
#define pr_err(...)		h_log(__VA_ARGS__)
#define pr_warn(...)		h_log(__VA_ARGS__)
#define dev_err(dev, ...)	h_log(__VA_ARGS__)
#define dev_warn(dev, ...)	h_log(__VA_ARGS__)
#define dev_warn_ratelimited(dev, ...)	h_log(__VA_ARGS__)
int h_warn(const char *fmt, ...);
#define WARN(cond, ...)		((cond) ? h_warn(__VA_ARGS__) : 0)
#define dev_info(dev, ...)	h_log(__VA_ARGS__)

/* bits and atomics */
static inline int test_bit(int nr, const unsigned long *addr)
{
	return (__atomic_load_n(addr, __ATOMIC_RELAXED) >> nr) & 1;
}

static inline void set_bit(int nr, unsigned long *addr)
{
	__atomic_or_fetch(addr, 1UL << nr, __ATOMIC_RELAXED);
}

typedef struct { long long counter; } atomic64_t;
#define atomic64_inc(a)		__atomic_add_fetch(&(a)->counter, 1, __ATOMIC_RELAXED)
#define atomic64_add(n, a)	__atomic_add_fetch(&(a)->counter, (n), __ATOMIC_RELAXED)
#define atomic64_read(a)	__atomic_load_n(&(a)->counter, __ATOMIC_RELAXED)

typedef struct { int counter; } atomic_t;
#define atomic_read(a)		__atomic_load_n(&(a)->counter, __ATOMIC_SEQ_CST)
#define atomic_set(a, v)	__atomic_store_n(&(a)->counter, (v), __ATOMIC_SEQ_CST)
#define atomic_inc(a)		__atomic_add_fetch(&(a)->counter, 1, __ATOMIC_SEQ_CST)
#define atomic_or(v, a)		__atomic_or_fetch(&(a)->counter, (int)(v), __ATOMIC_SEQ_CST)

struct kref { int refcount; };
static inline void kref_init(struct kref *k) { k->refcount = 1; }
static inline void kref_get(struct kref *k) { __atomic_add_fetch(&k->refcount, 1, __ATOMIC_SEQ_CST); }
static inline int kref_put(struct kref *k, void (*release)(struct kref *))
{
	if (__atomic_sub_fetch(&k->refcount, 1, __ATOMIC_SEQ_CST))
		return 0;
	release(k);
	return 1;
}

struct mutex { pthread_mutex_t m; };
#define mutex_init(l)		pthread_mutex_init(&(l)->m, NULL)
#define mutex_lock(l)		pthread_mutex_lock(&(l)->m)
#define mutex_unlock(l)		pthread_mutex_unlock(&(l)->m)
#define mutex_trylock(l)	(pthread_mutex_trylock(&(l)->m) == 0)

struct ida { int next; };
#define DEFINE_IDA(name)	struct ida name = { 0 }
static inline int ida_alloc(struct ida *ida, gfp_t gfp) { return ida->next++; }
static inline void ida_free(struct ida *ida, int id) { }
static inline void ida_destroy(struct ida *ida) { ida->next = 0; }

/* wait queues: one condition variable for all of them; jiffies are milliseconds */
#define ERESTARTSYS		512
typedef struct { int unused; } wait_queue_head_t;
#define init_waitqueue_head(q)	do { } while (0)
void wake_up(wait_queue_head_t *q);
void h_wq_wait(void);		/* until a wake_up() or 1 ms */
#define msecs_to_jiffies(ms)	((long)(ms))
#define wait_event_interruptible_timeout(q, cond, t) ({				\
	s64 __end = h_clock_ns(0) + (s64)(t) * 1000000;				\
	long __r;								\
	for (;;) {								\
		s64 __left = __end - h_clock_ns(0);				\
		if (cond) {							\
			__r = __left > 1000000 ? __left / 1000000 : 1;		\
			break;							\
		}								\
		if (h_signal_pending()) {					\
			__r = -ERESTARTSYS;					\
			break;							\
		}								\
		if (__left <= 0) {						\
			__r = 0;						\
			break;							\
		}								\
		h_wq_wait();							\
	}								\
	__r; })

/* interrupts: the harness's engine calls the handler as an MSI would */
typedef enum { IRQ_NONE, IRQ_HANDLED } irqreturn_t;
typedef irqreturn_t (*irq_handler_t)(int irq, void *data);
#define PCI_IRQ_MSI		2
#define PCI_IRQ_MSIX		4
struct pci_dev;
int pci_alloc_irq_vectors(struct pci_dev *pdev, unsigned int min, unsigned int max, unsigned int flags);
void pci_free_irq_vectors(struct pci_dev *pdev);
int pci_irq_vector(struct pci_dev *pdev, unsigned int nr);
int request_irq(unsigned int irq, irq_handler_t handler, unsigned long flags, const char *name,
		void *data);
void free_irq(unsigned int irq, void *data);

/* time: monotonic and real clocks, sleeps; signals from the harness */
s64 h_clock_ns(int real);
void h_sleep_us(unsigned long us);
bool h_signal_pending(void);
#define ktime_get()		h_clock_ns(0)
#define ktime_get_real_ns()	((u64)h_clock_ns(1))
#define ktime_add_ms(t, ms)	((t) + (s64)(ms) * 1000000)
#define ktime_before(a, b)	((a) < (b))
#define ktime_sub(a, b)		((a) - (b))
#define ktime_to_ns(t)		(t)
#define ktime_us_delta(a, b)	(((a) - (b)) / 1000)
#define udelay(us)		h_sleep_us(us)
#define usleep_range(lo, hi)	h_sleep_us(lo)
#define current			NULL
#define signal_pending(p)	h_signal_pending()
#define CAP_SYS_RAWIO		17
bool capable(int cap);

/* memory and strings */
#define kzalloc(n, gfp)			calloc(1, n)
#define kcalloc(n, s, gfp)		calloc(n, s)
#define kvmalloc_array(n, s, gfp)	calloc(n, s)
#define kfree(p)			free((void *)(p))
#define kvfree(p)			free(p)
#define kstrdup(s, gfp)			strdup(s)
int strscpy(char *dst, const char *src, size_t n);
int match_string(const char * const *array, size_t n, const char *s);
int kstrtoint(const char *s, unsigned int base, int *res);
int kstrtou64(const char *s, unsigned int base, u64 *res);
int sysfs_emit(char *buf, const char *fmt, ...);
void get_random_bytes(void *buf, size_t n);

/* user memory is this process's */
#define access_ok(p, n)		1
#define u64_to_user_ptr(x)	((void *)(uintptr_t)(x))
#define get_user(x, p)		((x) = *(p), 0)
#define copy_to_user(to, from, n)	(memcpy(to, from, n), 0)
int copy_struct_from_user(void *dst, size_t ksize, const void *src, size_t usize);
struct page;
#define FOLL_WRITE		1
#define FOLL_LONGTERM		0x100
int pin_user_pages_fast(unsigned long start, int n, unsigned int flags, struct page **pages);
#define unpin_user_pages_dirty_lock(pages, n, dirty)	do { } while (0)

/* registers */
u32 ioread32(const void *addr);
void iowrite32(u32 val, void *addr);

/* devices */
struct module;
struct attribute { const char *name; };
struct attribute_group { struct attribute **attrs; };
#define ATTRIBUTE_GROUPS(n) \
	static const struct attribute_group n##_group = { n##_attrs }; \
	static const struct attribute_group *n##_groups[] = { &n##_group, NULL }
struct device_driver { const char *name; const struct attribute_group **dev_groups; };
struct device { struct device_driver *driver; void *driver_data; };
struct bus_type { int unused; };
extern struct bus_type pci_bus_type;
struct device_driver *driver_find(const char *name, struct bus_type *bus);
static inline void *dev_get_drvdata(struct device *dev) { return dev->driver_data; }

struct device_attribute {
	struct attribute attr;
	ssize_t (*show)(struct device *dev, struct device_attribute *attr, char *buf);
	ssize_t (*store)(struct device *dev, struct device_attribute *attr, const char *buf,
			 size_t count);
};
#define DEVICE_ATTR_RW(n)	struct device_attribute dev_attr_##n = { { #n }, n##_show, n##_store }
#define DEVICE_ATTR_RO(n)	struct device_attribute dev_attr_##n = { { #n }, n##_show, NULL }

#define IORESOURCE_MEM		0x200
#define IORESOURCE_UNSET	0x20000000
#define PCI_STD_NUM_BARS	6
#define PCI_ANY_ID		(~0U)
struct resource { resource_size_t start, end; unsigned long flags; };
struct pci_bus { int number; };
struct pci_dev {
	struct device dev;
	unsigned short vendor, device;
	char *driver_override;
	struct resource resource[PCI_STD_NUM_BARS];
	const char *name;
	struct pci_bus *bus;
	unsigned int devfn;
	struct pci_dev *upstream;
};
#define PCI_SLOT(devfn)		(((devfn) >> 3) & 0x1f)
#define pci_upstream_bridge(p)	((p)->upstream)
struct pci_device_id { int unused; };
struct pci_driver {
	const char *name;
	const struct pci_device_id *id_table;
	int (*probe)(struct pci_dev *pdev, const struct pci_device_id *id);
	void (*remove)(struct pci_dev *pdev);
	struct device_driver driver;
};
#define pci_resource_start(p, b)	((p)->resource[b].start)
#define pci_resource_flags(p, b)	((p)->resource[b].flags)
#define pci_resource_len(p, b)	((p)->resource[b].end ? \
				 (p)->resource[b].end - (p)->resource[b].start + 1 : 0)
#define pci_bus_address(p, b)	((pci_bus_addr_t)pci_resource_start(p, b))	/* x86: bus == CPU */
#define pci_name(p)		((p)->name)
#define pci_dev_get(p)		(p)
#define pci_dev_put(p)		do { } while (0)
void pci_set_master(struct pci_dev *pdev);
void pci_clear_master(struct pci_dev *pdev);
#define PCI_COMMAND		0x04
#define PCI_COMMAND_MASTER	0x4
int pci_read_config_word(struct pci_dev *pdev, int where, u16 *val);
#define pci_set_drvdata(p, d)	((p)->dev.driver_data = (d))
#define pci_get_drvdata(p)	((p)->dev.driver_data)
#define pcim_enable_device(p)	0
#define dma_set_mask_and_coherent(dev, m)	0
struct pci_dev *pci_get_device(unsigned int vendor, unsigned int device, struct pci_dev *from);
void __iomem *pcim_iomap(struct pci_dev *pdev, int bar, unsigned long maxlen);
int pci_register_driver(struct pci_driver *drv);
void pci_unregister_driver(struct pci_driver *drv);

/* DMA mapping: dma addresses of memory are its virtual addresses (an identity IOMMU) */
enum dma_data_direction { DMA_BIDIRECTIONAL, DMA_TO_DEVICE, DMA_FROM_DEVICE, DMA_NONE };
#define DMA_MAPPING_ERROR	(~(dma_addr_t)0)
#define dma_mapping_error(dev, a)	((a) == DMA_MAPPING_ERROR)
void *dma_alloc_coherent(struct device *dev, size_t size, dma_addr_t *dma, gfp_t gfp);
void dma_free_coherent(struct device *dev, size_t size, void *cpu, dma_addr_t dma);
dma_addr_t dma_map_resource(struct device *dev, phys_addr_t phys, size_t size,
			    enum dma_data_direction dir, unsigned long attrs);
void dma_unmap_resource(struct device *dev, dma_addr_t addr, size_t size,
			enum dma_data_direction dir, unsigned long attrs);

struct scatterlist { dma_addr_t dma_address; unsigned int dma_length; };
struct sg_table { struct scatterlist *sgl; unsigned int nents, orig_nents; };
#define sg_dma_address(sg)	((sg)->dma_address)
#define sg_dma_len(sg)		((sg)->dma_length)
#define for_each_sgtable_dma_sg(t, sg, i) \
	for ((i) = 0, (sg) = (t)->sgl; (i) < (int)(t)->nents; (i)++, (sg)++)
int sg_alloc_table_from_pages(struct sg_table *sgt, struct page **pages, unsigned int n,
			      unsigned int off, unsigned long size, gfp_t gfp);
#define sg_free_table(t)	free((t)->sgl)
int dma_map_sgtable(struct device *dev, struct sg_table *sgt, enum dma_data_direction dir,
		    unsigned long attrs);
void dma_unmap_sgtable(struct device *dev, struct sg_table *sgt, enum dma_data_direction dir,
		       unsigned long attrs);

/* character devices */
struct inode { int unused; };
struct file { void *private_data; };
struct file_operations {
	struct module *owner;
	int (*open)(struct inode *inode, struct file *file);
	int (*release)(struct inode *inode, struct file *file);
	long (*unlocked_ioctl)(struct file *file, unsigned int cmd, unsigned long arg);
	long (*compat_ioctl)(struct file *file, unsigned int cmd, unsigned long arg);
};
#define nonseekable_open(i, f)	0
long compat_ptr_ioctl(struct file *file, unsigned int cmd, unsigned long arg);
#define MISC_DYNAMIC_MINOR	255
struct miscdevice {
	int minor;
	const char *name;
	const struct file_operations *fops;
	umode_t mode;
	struct device *parent;
};
int misc_register(struct miscdevice *misc);
void misc_deregister(struct miscdevice *misc);

#endif
