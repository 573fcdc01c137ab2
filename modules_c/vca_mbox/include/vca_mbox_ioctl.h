/* SPDX-License-Identifier: GPL-2.0 WITH Linux-syscall-note */
#ifndef VCAFLEET_VCA_MBOX_IOCTL_H
#define VCAFLEET_VCA_MBOX_IOCTL_H

#include <linux/ioctl.h>
#include <linux/types.h>

struct vca_mbox_msg {
	__s32 device;	/* plx87xx device index */
	__u32 value;	/* word posted or read */
};

#define VCA_MBOX_MAGIC 'v'
#define VCA_MBOX_POST _IOW(VCA_MBOX_MAGIC, 1, struct vca_mbox_msg)
#define VCA_MBOX_READ _IOWR(VCA_MBOX_MAGIC, 2, struct vca_mbox_msg)

#endif
