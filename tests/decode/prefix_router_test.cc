// PrefixRouter: prompts that share a prefix meet on one prefill worker (a
// rotation divided the prefix cache by the number of workers: 3 workers kept
// 0.6x of what one kept), the longest remembered prefix wins, and no worker
// is loaded past the bound however hot one prefix is.
#include "decode_worker/prefix_router.h"

#include <algorithm>
#include <numeric>
#include <set>

#include "decode_worker/prefill_pool.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

constexpr int kBlock = 16;

std::vector<int32_t> Prompt(int system, int system_blocks, int question, int question_tokens) {
  std::vector<int32_t> t;
  for (int i = 0; i < system_blocks * kBlock; ++i) t.push_back(1000 * system + i % 97);
  for (int i = 0; i < question_tokens; ++i) t.push_back(50000 + question * 31 + i);
  return t;
}

// Endpoint identities, as PrefillPool gives them (a hash of the address).
std::vector<uint64_t> Ids() { return {101, 202, 303, 404}; }

std::vector<uint64_t> ChainOf(const std::vector<int32_t>& t, uint64_t salt = 0) {
  return PrefixRouter::Chain(t.data(), t.size(), kBlock, salt);
}

TEST(PrefixRouterTest, ChainsCoverFullBlocksAndDependOnTheirPrefixAndSalt) {
  const std::vector<int32_t> a = Prompt(1, 4, 0, 10);
  EXPECT_EQ(ChainOf(a).size(), 4u + 0u);  // 64 + 10 tokens: four full blocks
  EXPECT_TRUE(ChainOf(std::vector<int32_t>(15, 7)).empty());
  std::vector<int32_t> b = a;
  b[0] += 1;  // the first block differs: so does every later hash
  const auto ca = ChainOf(a), cb = ChainOf(b);
  for (size_t i = 0; i < ca.size(); ++i) EXPECT_NE(ca[i], cb[i]) << i;
  EXPECT_NE(ChainOf(a, 1)[0], ca[0]);
  EXPECT_EQ(ChainOf(a), ca);
}

TEST(PrefixRouterTest, PromptsSharingASystemPromptMeetOnOneEndpoint) {
  PrefixRouter router({});
  const std::vector<int> all = {0, 1, 2};
  const std::vector<int64_t> idle(3, 0);
  std::vector<int> home(16, -1);
  std::set<int> used;
  for (int q = 0; q < 32; ++q) {
    const int system = q % 16;
    const auto p = Prompt(system, 32, q, 32);  // 512-token system prompt + a question
    const PrefixRouter::Choice c = router.Pick(ChainOf(p), 64, all, idle, Ids());
    if (home[system] < 0) {
      home[system] = c.endpoint;
      EXPECT_EQ(c.reason, PrefixRouter::Reason::kHash);
      EXPECT_EQ(c.matched_blocks, 0);
    } else {
      EXPECT_EQ(c.endpoint, home[system]) << "request " << q;
      EXPECT_EQ(c.reason, PrefixRouter::Reason::kPrefix);
      EXPECT_EQ(c.matched_blocks, 32);  // the system prompt; the question is new
    }
    used.insert(c.endpoint);
  }
  // Sixteen prefixes spread over the three (the hashes are fixed: the same
  // in every run and every process).
  EXPECT_EQ(used.size(), 3u);
}

// Two routers (two decode workers) that list the endpoints in different
// orders send a prefix neither has seen to the same endpoint.
TEST(PrefixRouterTest, DecodeWorkersAgreeWhereANewPrefixGoes) {
  PrefixRouter first({}), second({});
  const std::vector<uint64_t> ids = {101, 202, 303}, reversed = {303, 202, 101};
  for (int s = 0; s < 12; ++s) {
    const auto chain = ChainOf(Prompt(s, 4, 0, 0));
    const int a = first.Pick(chain, 64, {0, 1, 2}, {0, 0, 0}, ids).endpoint;
    const int b = second.Pick(chain, 64, {0, 1, 2}, {0, 0, 0}, reversed).endpoint;
    EXPECT_EQ(ids[a], reversed[b]) << "system prompt " << s;
  }
}

TEST(PrefixRouterTest, TheLongestRememberedPrefixWins) {
  PrefixRouter router({});
  const std::vector<int64_t> idle(3, 0);
  const auto turn1 = Prompt(7, 4, 1, 40);
  auto turn2 = turn1;  // a conversation's next turn extends the last
  for (int i = 0; i < 50; ++i) turn2.push_back(70000 + i);
  const int first = router.Pick(ChainOf(turn1), 100, {0, 1, 2}, idle, Ids()).endpoint;
  // Another endpoint is sent the system prompt alone (say the first was out
  // of the candidates then).
  std::vector<int> others;
  for (int e : {0, 1, 2}) {
    if (e != first) others.push_back(e);
  }
  const int other = router.Pick(ChainOf(Prompt(7, 4, 2, 0)), 64, others, idle, Ids()).endpoint;
  ASSERT_NE(other, first);
  const PrefixRouter::Choice c = router.Pick(ChainOf(turn2), 50, {0, 1, 2}, idle, Ids());
  EXPECT_EQ(c.endpoint, first);
  EXPECT_EQ(c.matched_blocks, static_cast<int>(turn1.size()) / kBlock);
  EXPECT_EQ(c.reason, PrefixRouter::Reason::kPrefix);
}

TEST(PrefixRouterTest, OnlyCandidatesAreChosen) {
  PrefixRouter router({});
  const std::vector<int64_t> idle(4, 0);
  const auto p = Prompt(3, 8, 0, 0);
  const int home = router.Pick(ChainOf(p), 128, {0, 1, 2, 3}, idle, Ids()).endpoint;
  std::vector<int> without;
  for (int e = 0; e < 4; ++e) {
    if (e != home) without.push_back(e);
  }
  for (int i = 0; i < 5; ++i) {
    const int e = router.Pick(ChainOf(p), 128, without, idle, Ids()).endpoint;
    EXPECT_NE(e, home);
  }
}

TEST(PrefixRouterTest, AnOverloadedHolderIsPassedOver) {
  PrefixRouter router({});
  const auto p = Prompt(5, 16, 0, 0);
  const int home = router.Pick(ChainOf(p), 256, {0, 1, 2}, {0, 0, 0}, Ids()).endpoint;
  std::vector<int64_t> loads(3, 100);
  loads[home] = 3000;  // far past 1.25x the mean, and the mean + this prompt
  const PrefixRouter::Choice c = router.Pick(ChainOf(p), 256, {0, 1, 2}, loads, Ids());
  EXPECT_NE(c.endpoint, home);
  EXPECT_EQ(c.reason, PrefixRouter::Reason::kLoad);
  // Within the bound it stays home.
  loads[home] = 100;
  EXPECT_EQ(router.Pick(ChainOf(p), 256, {0, 1, 2}, loads, Ids()).endpoint, home);
}

// One hot system prompt, many prompts in flight at once: none of the three
// endpoints carries more than the bound (1.25x the mean, or the mean and one
// prompt).
TEST(PrefixRouterTest, AHotPrefixSpreadsWithinTheLoadBound) {
  PrefixRouter router({});
  std::vector<int64_t> loads(3, 0);
  const int64_t tokens = 544;
  for (int q = 0; q < 60; ++q) {
    const auto p = Prompt(9, 32, q, 32);
    const int e = router.Pick(ChainOf(p), tokens, {0, 1, 2}, loads, Ids()).endpoint;
    loads[e] += tokens;  // none completes
    const int64_t total = std::accumulate(loads.begin(), loads.end(), int64_t{0});
    const double mean = static_cast<double>(total) / 3;
    EXPECT_LE(static_cast<double>(*std::max_element(loads.begin(), loads.end())),
              std::max(1.25 * mean, mean + static_cast<double>(tokens)))
        << "after " << q + 1;
  }
  EXPECT_GT(*std::min_element(loads.begin(), loads.end()), 0);
}

TEST(PrefixRouterTest, WhatItRemembersIsBounded) {
  PrefixRouter::Options o;
  o.capacity_blocks = 100;
  PrefixRouter router(o);
  for (int q = 0; q < 50; ++q) router.Pick(ChainOf(Prompt(q, 8, q, 0)), 128, {0, 1}, {0, 0}, Ids());
  EXPECT_LE(router.remembered(), 100u);
  // The newest are remembered.
  const auto last = Prompt(49, 8, 49, 0);
  EXPECT_EQ(router.Pick(ChainOf(last), 128, {0, 1}, {0, 0}, Ids()).reason, PrefixRouter::Reason::kPrefix);
}

// Through the pool: a prompt routed by its prefix goes where its prefix went;
// --prefill-routing=round_robin rotates as before.
TEST(PrefillPoolRoutingTest, PrefixRoutingAndRoundRobin) {
  PrefillPool pool("ipv4:10.1.0.5:50061,10.1.0.6:50061,10.1.0.7:50061",
                   grpc::InsecureChannelCredentials(), grpc::ChannelArguments(), absl::Seconds(10));
  const auto p = Prompt(2, 8, 0, 5);
  PrefillPool::RouteKey key{&p, 0, 0};
  PrefillPool::RouteInfo info;
  PrefillPool::Endpoint* home = pool.Pick(nullptr, &key, &info);
  EXPECT_STREQ(info.reason, "hash");
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(pool.Pick(nullptr, &key, &info), home);
    EXPECT_STREQ(info.reason, "prefix");
    EXPECT_EQ(info.matched_tokens, 8 * PrefillPool::kRouteBlockTokens);
  }
  EXPECT_NE(pool.Pick(home, &key, &info), home);  // a retry goes elsewhere
  // A prompt shorter than a block has no prefix to keep: the rotation.
  const std::vector<int32_t> tiny = {1, 2, 3};
  PrefillPool::RouteKey tiny_key{&tiny, 0, 0};
  std::set<PrefillPool::Endpoint*> spread;
  for (int i = 0; i < 3; ++i) {
    PrefillPool::RouteInfo rr;
    spread.insert(pool.Pick(nullptr, &tiny_key, &rr));
    EXPECT_STREQ(rr.reason, "round_robin");
  }
  EXPECT_EQ(spread.size(), 3u);
  pool.set_routing(PrefillPool::Routing::kRoundRobin);
  std::set<PrefillPool::Endpoint*> seen;
  for (int i = 0; i < 3; ++i) {
    PrefillPool::RouteInfo rr;
    seen.insert(pool.Pick(nullptr, &key, &rr));
    EXPECT_STREQ(rr.reason, "round_robin");
  }
  EXPECT_EQ(seen.size(), 3u);
}

}  // namespace
}  // namespace tandem
