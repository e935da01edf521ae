/* SPDX-License-Identifier: Apache-2.0 */
/*
 * token_bucket.bpf.c -- the paper's mechanism (design §4 "Enforcement": "a TC BPF token bucket per flow, rates
 * written to a BPF hash map"), kept as a selectable mode so it can be measured beside BPF + HTB.
 *
 * Per flow a bucket of `burst_bytes` tokens refills at `rate_bytes_per_s`; a packet that finds too few tokens
 * is dropped. There is no queue, so the only feedback TCP gets is loss. STACK.md measured what this needs to
 * work at all, and this file does it:
 *   - GSO: TC sees "super-packets" of up to 64 KiB; they are charged their full wire size (headers repeated per
 *     segment, see rn_wire_bytes) and the bucket is at least 128 KiB deep, else one packet never fits;
 *   - verdict TC_ACT_STOLEN (default): the packet vanishes silently. With TC_ACT_SHOT the sending TCP is told
 *     "dropped locally" and backs off to its ~200 ms probe timer; the throughput collapses (0.006-0.12 of the
 *     rate). Set RN_TB_DROP_ACTION=TC_ACT_SHOT to see that;
 *   - a route with a small `rto_min` (5 ms) on the sender helps TCP recover; that is routing, set outside BPF.
 * Even then it reaches 0.94-0.98 of the rate with tens of thousands of retransmits; HTB reaches it exactly.
 *
 * The bucket update is not atomic across CPUs (two CPUs may refill the same bucket at once). That can only
 * err by a few packets' worth of tokens, which is small beside the burst, and avoids a spin lock per packet.
 * DSCP marking and counting are identical to flow_classifier.bpf.c.
 */
#include "rn_parse.h"

#ifndef RN_TB_DROP_ACTION
#define RN_TB_DROP_ACTION TC_ACT_STOLEN
#endif
#define RN_NS_PER_S 1000000000ULL

BPF_HASH(rn_flows, struct rn_flow_key, struct rn_flow_info, RN_MAX_FLOWS);
BPF_PERCPU_HASH(rn_flow_stats, struct rn_flow_key, struct rn_flow_stats, RN_MAX_FLOWS + 1);
BPF_HASH(rn_buckets, struct rn_flow_key, struct rn_bucket, RN_MAX_FLOWS);

/* Refill the flow's bucket for the time elapsed and try to take `cost` tokens. Returns 1 if the packet fits. */
static __always_inline int rn_take_tokens(struct rn_flow_key *key, struct rn_flow_info *info, __u64 cost)
{
	__u64 now = bpf_ktime_get_ns();
	struct rn_bucket fresh = {};
	struct rn_bucket *b;
	__u64 elapsed, tokens;

	b = rn_buckets.lookup(key);
	if (!b) {
		/* First packet of the flow: start with a full bucket. */
		fresh.tokens_bytes = info->burst_bytes;
		fresh.last_ns = now;
		rn_buckets.update(key, &fresh);
		b = rn_buckets.lookup(key);
		if (!b)
			return 1;
	}
	elapsed = now > b->last_ns ? now - b->last_ns : 0;
	/* After a second of silence the bucket is full anyway; the cap also keeps the product below 2^64. */
	if (elapsed >= RN_NS_PER_S)
		tokens = info->burst_bytes;
	else
		tokens = b->tokens_bytes + elapsed * info->rate_bytes_per_s / RN_NS_PER_S;
	if (tokens > info->burst_bytes)
		tokens = info->burst_bytes;
	/* Integer division drops under one byte of credit per packet: negligible beside the 128 KiB burst. */
	b->last_ns = now;
	if (tokens < cost) {
		b->tokens_bytes = tokens;
		return 0;
	}
	b->tokens_bytes = tokens - cost;
	return 1;
}

int rn_token_bucket(struct __sk_buff *skb)
{
	struct rn_pkt p = {};
	struct rn_flow_stats zero = {};
	struct rn_flow_key other = {};
	struct rn_flow_info *info;
	struct rn_flow_stats *st;
	__u32 segs;
	__u64 wire;

	if (rn_parse(skb, &p) <= 0)
		return TC_ACT_OK;
	wire = rn_wire_bytes(skb, &p, &segs);

	info = rn_flows.lookup(&p.key);
	if (!info) {
		st = rn_flow_stats.lookup_or_try_init(&other, &zero);
		if (st) {
			st->bytes += wire;
			st->packets += segs;
		}
		return TC_ACT_OK;
	}
	st = rn_flow_stats.lookup_or_try_init(&p.key, &zero);
	if (!rn_take_tokens(&p.key, info, wire)) {
		if (st) {
			st->dropped_bytes += wire;
			st->dropped_packets += segs;
		}
		return RN_TB_DROP_ACTION;
	}
	if (st) {
		st->bytes += wire;
		st->packets += segs;
	}
	rn_set_dscp(skb, &p, rn_class_dscp(info->flow_class));
	return TC_ACT_OK;
}
