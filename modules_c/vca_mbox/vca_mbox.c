// SPDX-License-Identifier: GPL-2.0
/*
 * vca_mbox: a message mailbox between the host and a VCA node over the PLX
 * switch's scratchpad registers and a doorbell, through the plx_mbox API
 * that our patch adds to plx87xx.
 *
 * /dev/vca_mbox takes one ioctl per operation: post a 32-bit word into a
 * scratchpad and ring a doorbell, or read a scratchpad. The seed measured a
 * notify round trip of about 35 us across card 0 with this scheme.
 *
 * The plx_mbox symbols are resolved at run time (symbol_get), so the module
 * builds against plain kernel headers and refuses to load, with a message,
 * where plx87xx lacks the patch.
 */
#include <linux/capability.h>
#include <linux/fs.h>
#include <linux/miscdevice.h>
#include <linux/module.h>
#include <linux/mutex.h>
#include <linux/uaccess.h>

#include "plx_mbox.h"
#include "vca_mbox_ioctl.h"

static unsigned int spad_index = 7;
module_param(spad_index, uint, 0444);
MODULE_PARM_DESC(spad_index, "scratchpad used for messages (default 7; the VCA driver uses 0-3 for LBP)");

static unsigned int doorbell = 15;
module_param(doorbell, uint, 0444);
MODULE_PARM_DESC(doorbell, "doorbell rung after a message is posted (default 15, unused by vop)");

static struct {
	typeof(plx_mbox_get) *get;
	typeof(plx_mbox_put) *put;
	typeof(plx_mbox_spad_read) *read;
	typeof(plx_mbox_spad_write) *write;
	typeof(plx_mbox_ring) *ring;
	typeof(plx_mbox_api_version) *version;
} api;

static DEFINE_MUTEX(vca_mbox_lock);

static void vca_mbox_release_api(void)
{
	if (api.get)
		symbol_put(plx_mbox_get);
	if (api.put)
		symbol_put(plx_mbox_put);
	if (api.read)
		symbol_put(plx_mbox_spad_read);
	if (api.write)
		symbol_put(plx_mbox_spad_write);
	if (api.ring)
		symbol_put(plx_mbox_ring);
	if (api.version)
		symbol_put(plx_mbox_api_version);
	memset(&api, 0, sizeof(api));
}

static int vca_mbox_resolve_api(void)
{
	api.get = symbol_get(plx_mbox_get);
	api.put = symbol_get(plx_mbox_put);
	api.read = symbol_get(plx_mbox_spad_read);
	api.write = symbol_get(plx_mbox_spad_write);
	api.ring = symbol_get(plx_mbox_ring);
	api.version = symbol_get(plx_mbox_api_version);
	if (!api.get || !api.put || !api.read || !api.write || !api.ring || !api.version) {
		vca_mbox_release_api();
		pr_err("vca_mbox: plx87xx has no plx_mbox API; load a plx87xx built with the vcafleet plx_mbox patch\n");
		return -ENOENT;
	}
	if (api.version() != PLX_MBOX_API_VERSION) {
		pr_err("vca_mbox: plx_mbox API version %d, expected %d\n", api.version(),
		       PLX_MBOX_API_VERSION);
		vca_mbox_release_api();
		return -EPROTO;
	}
	return 0;
}

static long vca_mbox_ioctl(struct file *file, unsigned int cmd, unsigned long arg)
{
	struct vca_mbox_msg msg;
	struct plx_mbox *mbox;
	long ret = 0;

	if (cmd != VCA_MBOX_POST && cmd != VCA_MBOX_READ)
		return -ENOTTY;
	/* a descriptor handed on does not carry the right: asked on every call, as vca_dma does */
	if (!capable(CAP_SYS_RAWIO))
		return -EPERM;
	if (copy_from_user(&msg, (void __user *)arg, sizeof(msg)))
		return -EFAULT;

	/* a reference that keeps plx87xx's data alive until put(); ops fail once it unbinds */
	mutex_lock(&vca_mbox_lock);
	mbox = api.get(msg.device);
	if (!mbox) {
		ret = -ENODEV;
		goto out;
	}
	if (cmd == VCA_MBOX_POST) {
		ret = api.write(mbox, spad_index, msg.value);
		if (!ret)
			ret = api.ring(mbox, doorbell);
	} else {
		ret = api.read(mbox, spad_index, &msg.value);
	}
	api.put(mbox);
out:
	mutex_unlock(&vca_mbox_lock);
	if (!ret && cmd == VCA_MBOX_READ && copy_to_user((void __user *)arg, &msg, sizeof(msg)))
		ret = -EFAULT;
	return ret;
}

static const struct file_operations vca_mbox_fops = {
	.owner = THIS_MODULE,
	.unlocked_ioctl = vca_mbox_ioctl,
	.compat_ioctl = compat_ptr_ioctl,
};

static struct miscdevice vca_mbox_dev = {
	.minor = MISC_DYNAMIC_MINOR,
	.name = "vca_mbox",
	.fops = &vca_mbox_fops,
	.mode = 0600,
};

static int __init vca_mbox_init(void)
{
	int ret;

	if (spad_index >= PLX_MBOX_NUM_SPADS || doorbell >= PLX_MBOX_NUM_DOORBELLS) {
		pr_err("vca_mbox: spad_index must be < %d and doorbell < %d\n",
		       PLX_MBOX_NUM_SPADS, PLX_MBOX_NUM_DOORBELLS);
		return -EINVAL;
	}
	ret = vca_mbox_resolve_api();
	if (ret)
		return ret;
	ret = misc_register(&vca_mbox_dev);
	if (ret)
		vca_mbox_release_api();
	return ret;
}

static void __exit vca_mbox_exit(void)
{
	misc_deregister(&vca_mbox_dev);
	vca_mbox_release_api();
}

module_init(vca_mbox_init);
module_exit(vca_mbox_exit);
MODULE_DESCRIPTION("vcafleet: host/node mailbox over PLX scratchpads and doorbells");
MODULE_AUTHOR("vcafleet");
MODULE_LICENSE("GPL");
MODULE_SOFTDEP("pre: plx87xx");
