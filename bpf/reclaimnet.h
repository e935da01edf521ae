/* SPDX-License-Identifier: Apache-2.0 */
/*
 * reclaimnet.h -- the data the kernel programs and the Python node agent share (design §4 "Enforcement").
 *
 * A BPF "map" is a key/value table that lives in the kernel. The TC programs in this folder read and update
 * the maps on every packet; the node agent reads and writes the very same tables through the bpf() system
 * call. Both sides must therefore agree byte for byte on the layout of every key and value, and this header is
 * that agreement. nodeagent/enforcement/structs.py mirrors each struct with ctypes and checks, at load time,
 * that its sizes match the ones the compiler produced from this file; it also parses the RN_* #defines below,
 * so change a value here and Python follows.
 *
 * Rules for editing: only fixed-width fields (__u8/__u16/__u32/__u64), explicit padding, no bitfields, and
 * keep every struct a multiple of 8 bytes so no compiler inserts padding of its own.
 */
#ifndef RECLAIMNET_H
#define RECLAIMNET_H

/* Traffic classes of design §4 and the DSCP code point each one is stamped with. */
#define RN_CLASS_EMERGENCY 0 /* emergency checkpoint metadata: EF   */
#define RN_CLASS_MIGRATION 1 /* planned migration:             AF41 */
#define RN_CLASS_PRESYNC 2   /* checkpoint pre-sync:           CS1  */
#define RN_CLASS_RESEARCH 3  /* research traffic:              BE   */

#define RN_DSCP_EF 46
#define RN_DSCP_AF41 34
#define RN_DSCP_CS1 8
#define RN_DSCP_BE 0

/* Kill-switch modes, written into the one-slot array map rn_ks_mode. */
#define RN_KS_OFF 0    /* everything passes */
#define RN_KS_NO_NEW 1 /* new TCP connections (SYN without ACK) are dropped; the rest passes */
#define RN_KS_STRICT 2 /* only established TCP transfers on an allow-listed port pass (plus ARP/ND) */

/*
 * HTB handles. A qdisc/class handle is "major:minor" packed in 32 bits. We use major 0x524e ("RN") so the agent
 * can recognise, after a crash, which root qdisc on a device is its own and remove it (stale clean-up).
 */
#define RN_HTB_MAJOR 0x524e
#define RN_HTB_ROOT_MINOR 1     /* root class: the link capacity B */
#define RN_HTB_DEFAULT_MINOR 2  /* research / unclassified traffic: guaranteed B_res, may borrow up to B */
#define RN_HTB_FIRST_FLOW_MINOR 16

/* Size limits of the maps (can be overridden with -D at compile time). */
#ifndef RN_MAX_FLOWS
#define RN_MAX_FLOWS 1024
#endif
#define RN_MAX_PORTS 64

/*
 * Key of the per-flow maps: the destination of an egress flow. IPv4 addresses are stored IPv4-mapped
 * (::ffff:a.b.c.d) so one key type covers both families. daddr is in network byte order (as on the wire),
 * dport in host byte order (the program converts), which is what Python naturally writes.
 */
struct rn_flow_key {
	__u8 daddr[16];
	__u16 dport;
	__u16 pad; /* always 0: keys are compared as raw bytes, so padding must be zeroed */
};

/* What the agent says about one flow: its class, its HTB class and (token-bucket mode) its rate. */
struct rn_flow_info {
	__u32 classid;       /* HTB class handle (major << 16 | minor) put into skb->priority */
	__u8 flow_class;     /* RN_CLASS_* -> which DSCP to stamp */
	__u8 pad[3];
	__u64 rate_bytes_per_s; /* token-bucket mode only: refill rate, wire bytes per second */
	__u64 burst_bytes;      /* token-bucket mode only: bucket depth, >= 128 KiB (a GSO packet is up to 64 KiB) */
};

/* Per-flow counters (one copy per CPU; Python sums them). Bytes are wire bytes, see rn_wire_bytes(). */
struct rn_flow_stats {
	__u64 bytes;
	__u64 packets;
	__u64 dropped_bytes;
	__u64 dropped_packets;
};

/* Token-bucket state of one flow (token_bucket.bpf.c only). */
struct rn_bucket {
	__u64 tokens_bytes;
	__u64 last_ns; /* CLOCK_MONOTONIC of the last refill */
};

/* Kill-switch counters (a single shared slot, updated with atomic adds). */
struct rn_ks_stats {
	__u64 syn_dropped;
	__u64 other_dropped;
	__u64 passed_established; /* strict mode: packets let through because they belong to a migration */
	__u64 first_drop_ns;      /* CLOCK_MONOTONIC of the first drop since the agent last zeroed it */
};

#endif /* RECLAIMNET_H */
