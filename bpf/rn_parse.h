/* SPDX-License-Identifier: Apache-2.0 */
/*
 * rn_parse.h -- packet helpers shared by the TC programs (kernel side only; Python never reads this file).
 *
 * A note for readers who know networking but not BPF:
 *  - A TC program is a function the kernel calls for every packet leaving (egress) or entering (ingress) a
 *    device, with a `struct __sk_buff *skb` describing the packet. Its return value is the verdict:
 *    TC_ACT_OK (continue), TC_ACT_SHOT (drop, the sender is told), TC_ACT_STOLEN (drop silently).
 *  - The packet bytes are between skb->data and skb->data_end. Before *every* read the program must prove to
 *    the in-kernel verifier that the read stays below data_end; that is what all the `> data_end` checks are.
 *  - Functions are `static __always_inline`: the programs are small and the verifier likes one flat function.
 *  - Helpers such as bpf_l3_csum_replace() are kernel functions a BPF program may call.
 *  - After a helper that writes the packet, the data/data_end pointers are invalid, so writes come last.
 */
#ifndef RN_PARSE_H
#define RN_PARSE_H

#include <uapi/linux/bpf.h>
#include <uapi/linux/if_ether.h>
#include <uapi/linux/in.h>
#include <uapi/linux/ip.h>
#include <uapi/linux/ipv6.h>
#include <uapi/linux/pkt_cls.h>
#include <uapi/linux/tcp.h>
#include <uapi/linux/udp.h>

#include "reclaimnet.h"

/* Network <-> host byte order for 16-bit values (x86 and arm64 are little-endian). */
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define RN_HTONS(x) ((__u16)__builtin_bswap16((__u16)(x)))
#else
#define RN_HTONS(x) ((__u16)(x))
#endif
#define RN_NTOHS(x) RN_HTONS(x)

#define RN_L3_NONE 0
#define RN_L3_IPV4 4
#define RN_L3_IPV6 6

/* What the programs need to know about one packet. */
struct rn_pkt {
	struct rn_flow_key key; /* destination address (IPv4-mapped for v4) + destination port */
	__u8 saddr[16];         /* source address, same encoding */
	__u32 l3_off;           /* offset of the IP header (after Ethernet) */
	__u32 hdr_len;          /* Ethernet + IP + TCP/UDP header bytes: what every GSO segment repeats */
	__u16 sport;            /* host byte order, 0 when not TCP/UDP */
	__u16 dport;
	__u8 family;    /* RN_L3_* */
	__u8 proto;     /* IPPROTO_TCP, IPPROTO_UDP, ... */
	__u8 ds_field;  /* the current DS byte: DSCP << 2 | ECN */
	__u8 tcp_flags; /* byte 13 of the TCP header: CWR ECE URG ACK PSH RST SYN FIN */
};

#define RN_TCP_SYN 0x02
#define RN_TCP_ACK 0x10

/*
 * Parse Ethernet -> IPv4/IPv6 -> TCP/UDP. Returns -1 if the packet is truncated, 0 for non-IP (ARP, ...),
 * 1 for IP. IPv6 extension headers are not followed (ports stay 0), which only means such packets are not
 * matched to a flow.
 */
static __always_inline int rn_parse(struct __sk_buff *skb, struct rn_pkt *p)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	void *l4;

	if ((void *)(eth + 1) > data_end)
		return -1;
	p->l3_off = sizeof(*eth);

	if (eth->h_proto == RN_HTONS(ETH_P_IP)) {
		struct iphdr *ip = (void *)(eth + 1);
		__u32 ihl;

		if ((void *)(ip + 1) > data_end)
			return -1;
		ihl = (ip->ihl & 0xf) * 4;
		if (ihl < sizeof(*ip))
			return -1;
		p->family = RN_L3_IPV4;
		p->proto = ip->protocol;
		p->ds_field = ip->tos;
		/* ::ffff:a.b.c.d */
		p->key.daddr[10] = 0xff;
		p->key.daddr[11] = 0xff;
		__builtin_memcpy(&p->key.daddr[12], &ip->daddr, 4);
		p->saddr[10] = 0xff;
		p->saddr[11] = 0xff;
		__builtin_memcpy(&p->saddr[12], &ip->saddr, 4);
		p->hdr_len = sizeof(*eth) + ihl;
		/* A non-first fragment carries no ports. */
		if (ip->frag_off & RN_HTONS(0x1fff))
			return 1;
		l4 = (void *)ip + ihl;
	} else if (eth->h_proto == RN_HTONS(ETH_P_IPV6)) {
		struct ipv6hdr *ip6 = (void *)(eth + 1);

		if ((void *)(ip6 + 1) > data_end)
			return -1;
		p->family = RN_L3_IPV6;
		p->proto = ip6->nexthdr;
		/* The traffic class straddles the first two bytes: version(4) | class(8) | flow label(20). */
		p->ds_field = (ip6->priority << 4) | (ip6->flow_lbl[0] >> 4);
		__builtin_memcpy(p->key.daddr, &ip6->daddr, 16);
		__builtin_memcpy(p->saddr, &ip6->saddr, 16);
		p->hdr_len = sizeof(*eth) + sizeof(*ip6);
		l4 = (void *)(ip6 + 1);
	} else {
		return 0;
	}

	if (p->proto == IPPROTO_TCP) {
		struct tcphdr *tcp = l4;

		if ((void *)(tcp + 1) > data_end)
			return 1;
		p->sport = RN_NTOHS(tcp->source);
		p->dport = RN_NTOHS(tcp->dest);
		p->tcp_flags = ((__u8 *)tcp)[13];
		p->hdr_len += tcp->doff * 4;
	} else if (p->proto == IPPROTO_UDP) {
		struct udphdr *udp = l4;

		if ((void *)(udp + 1) > data_end)
			return 1;
		p->sport = RN_NTOHS(udp->source);
		p->dport = RN_NTOHS(udp->dest);
		p->hdr_len += sizeof(*udp);
	}
	p->key.dport = p->dport;
	return 1;
}

/*
 * Bytes this packet puts on the wire (Ethernet frames, without preamble/FCS, which is also what HTB counts).
 * With TSO/GSO the stack hands TC one "super-packet" of up to 64 KiB that the NIC later cuts into gso_segs
 * frames, each repeating the headers; the headers of all segments but the first are not in skb->len.
 */
static __always_inline __u64 rn_wire_bytes(struct __sk_buff *skb, struct rn_pkt *p, __u32 *segs)
{
	__u32 n = skb->gso_segs;

	if (n < 1)
		n = 1;
	*segs = n;
	return (__u64)skb->len + (__u64)(n - 1) * p->hdr_len;
}

static __always_inline __u8 rn_class_dscp(__u8 flow_class)
{
	switch (flow_class) {
	case RN_CLASS_EMERGENCY:
		return RN_DSCP_EF;
	case RN_CLASS_MIGRATION:
		return RN_DSCP_AF41;
	case RN_CLASS_PRESYNC:
		return RN_DSCP_CS1;
	default:
		return RN_DSCP_BE;
	}
}

/*
 * Stamp a DSCP code point, keeping the two ECN bits. IPv4 protects its header with a checksum, so the checksum
 * is patched incrementally (RFC 1624) for the 16-bit word that holds version/IHL and the DS byte; IPv6 has no
 * header checksum and TCP/UDP checksums do not cover the DS byte. Returns 0 on success.
 */
static __always_inline int rn_set_dscp(struct __sk_buff *skb, struct rn_pkt *p, __u8 dscp)
{
	__u8 new_ds = (dscp << 2) | (p->ds_field & 0x3);

	if (new_ds == p->ds_field)
		return 0;
	if (p->family == RN_L3_IPV4) {
		__u8 old_word[2], new_word[2];
		__u16 old16, new16;

		if (bpf_skb_load_bytes(skb, p->l3_off, old_word, 2) < 0)
			return -1;
		new_word[0] = old_word[0];
		new_word[1] = new_ds;
		__builtin_memcpy(&old16, old_word, 2);
		__builtin_memcpy(&new16, new_word, 2);
		if (bpf_l3_csum_replace(skb, p->l3_off + offsetof(struct iphdr, check), old16, new16, 2) < 0)
			return -1;
		return bpf_skb_store_bytes(skb, p->l3_off + 1, &new_ds, 1, 0);
	}
	if (p->family == RN_L3_IPV6) {
		__u8 b[2];

		if (bpf_skb_load_bytes(skb, p->l3_off, b, 2) < 0)
			return -1;
		b[0] = (b[0] & 0xf0) | (new_ds >> 4);
		b[1] = (b[1] & 0x0f) | (new_ds << 4);
		return bpf_skb_store_bytes(skb, p->l3_off, b, 2, 0);
	}
	return 0;
}

#endif /* RN_PARSE_H */
