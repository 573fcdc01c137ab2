/* SPDX-License-Identifier: GPL-2.0 */
/*
 * plx_mbox: the doorbell and scratchpad ("mailbox") registers of the PLX
 * switch's NT port, exported by plx87xx once our plx_mbox patch is applied
 * (roles/vca_host/files/patches/0001-plx_mbox.patch carries this same API).
 *
 * Users resolve the symbols at run time with symbol_get(), so a module built
 * against this header loads (and reports the patch missing) on a host whose
 * plx87xx lacks it, instead of failing to link.
 */
#ifndef VCAFLEET_PLX_MBOX_H
#define VCAFLEET_PLX_MBOX_H

#include <linux/types.h>

/* 2: get() hands out a reference that keeps plx87xx's data alive; the ops return an error */
#define PLX_MBOX_API_VERSION 2
#define PLX_MBOX_NUM_SPADS 8
#define PLX_MBOX_NUM_DOORBELLS 16

struct plx_mbox;

/*
 * A reference to the mailbox of plx87xx device number @id (the driver's own
 * index), or NULL; every one is dropped with plx_mbox_put(). It holds the PCI
 * device, and each op runs under the device lock and checks that plx87xx is
 * still bound, so a plx87xx unbound meanwhile makes the ops answer -ENODEV
 * instead of touching its freed data.
 */
struct plx_mbox *plx_mbox_get(int id);
void plx_mbox_put(struct plx_mbox *mbox);
int plx_mbox_api_version(void);
int plx_mbox_spad_read(struct plx_mbox *mbox, unsigned int idx, u32 *val);
int plx_mbox_spad_write(struct plx_mbox *mbox, unsigned int idx, u32 val);
/* Ring doorbell @db on the peer side of the NT port. */
int plx_mbox_ring(struct plx_mbox *mbox, unsigned int db);

#endif
