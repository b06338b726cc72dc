// PrefillPool::Named: which prefill endpoints a request may name
// (x-prefiller-host-port). Any client could make the decode worker dial any
// address (a DNS name too) and keep redialling it; 256 names later even a
// real prefill worker was refused. Channels are made, never called: nothing
// here dials.
#include "decode_worker/prefill_pool.h"

#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

std::unique_ptr<PrefillPool> MakePool(PrefillPool::Trust trust) {
  auto pool = std::make_unique<PrefillPool>("ipv4:10.1.0.5:50061,10.1.0.6:50061",
                                            grpc::InsecureChannelCredentials(), grpc::ChannelArguments(),
                                            absl::Seconds(10));
  pool->set_trust(std::move(trust));
  return pool;
}

TEST(PrefillPoolTrustTest, ByDefaultOnlyTheConfiguredEndpointsMayBeNamed) {
  auto pool = MakePool({});
  auto own = pool->Named("10.1.0.6:50061");
  ASSERT_TRUE(own.ok()) << own.status();
  EXPECT_EQ(own->get(), pool->endpoints()[1]);
  for (const char* other : {"127.0.0.1:40000", "evil.example.com:443", "[::1]:50061", "10.1.0.5:50062"}) {
    auto refused = pool->Named(other);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kPermissionDenied) << other;
    EXPECT_TRUE(absl::StrContains(refused.status().message(), "--prefiller-allow")) << refused.status();
  }
  EXPECT_EQ(pool->named_count(), 0);  // never made, so never dialled
}

TEST(PrefillPoolTrustTest, AnAllowListTakesAddressesAndNetworks) {
  PrefillPool::Trust trust;
  trust.allow = {"prefill-0.prefill:50061", "10.2.0.0/16", "fd00::/8"};
  ASSERT_TRUE(PrefillPool::CheckTrust(trust).ok());
  auto pool = MakePool(trust);
  for (const char* ok : {"prefill-0.prefill:50061", "10.2.3.4:1", "[fd00::7]:50061"}) {
    EXPECT_TRUE(pool->Named(ok).ok()) << ok;
  }
  for (const char* no : {"prefill-1.prefill:50061", "10.3.0.1:50061", "[fe80::1]:50061", "10.2.3.4.nip.io:1"}) {
    EXPECT_EQ(pool->Named(no).status().code(), absl::StatusCode::kPermissionDenied) << no;
  }
  EXPECT_FALSE(PrefillPool::CheckTrust({false, {"10.0.0.0/33"}}).ok());
  EXPECT_FALSE(PrefillPool::CheckTrust({false, {"just-a-name"}}).ok());
}

TEST(PrefillPoolTrustTest, MalformedNamesAreRefusedWhateverTheTrust) {
  PrefillPool::Trust any;
  any.any = true;
  auto pool = MakePool(any);
  for (const std::string& bad : {std::string("no port"), std::string("\xc3\xa9:5"), std::string("host:"),
                                std::string(":5"), std::string("[]:443"), std::string("a:5\n"), std::string("h:123456"),
                                std::string(300, 'a') + ":5"}) {
    EXPECT_EQ(pool->Named(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

// Past kMaxNamed names the least recently used idle one makes room: a new
// name (a real prefill worker's among them) is never refused for the
// names before it.
TEST(PrefillPoolTrustTest, NamedChannelsAreBoundedAndTheIdleGoFirst) {
  PrefillPool::Trust any;
  any.any = true;
  auto pool = MakePool(any);
  auto held = pool->Named("10.9.9.9:1");  // in use by a call: kept
  ASSERT_TRUE(held.ok());
  for (int i = 0; i < PrefillPool::kMaxNamed + 10; ++i) {
    ASSERT_TRUE(pool->Named("10.8.0.1:" + std::to_string(1000 + i)).ok()) << i;
  }
  EXPECT_EQ(pool->named_count(), PrefillPool::kMaxNamed);
  auto again = pool->Named("10.9.9.9:1");
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->get(), held->get());
}

}  // namespace
}  // namespace tandem

namespace tandem {
namespace {

// --prefill-address: a list is one endpoint each (routed by prefix among
// them), whatever the targets' form; one name is one endpoint.
TEST(PrefillPoolTargetsTest, ListsOfAnyFormAreOneEndpointEach) {
  using V = std::vector<std::string>;
  EXPECT_EQ(*PrefillPool::SplitTarget("ipv4:10.0.0.1:1,10.0.0.2:2"),
            (V{"ipv4:10.0.0.1:1", "ipv4:10.0.0.2:2"}));
  EXPECT_EQ(*PrefillPool::SplitTarget("ipv6:[::1]:1,[::2]:2"), (V{"ipv6:[::1]:1", "ipv6:[::2]:2"}));
  EXPECT_EQ(*PrefillPool::SplitTarget("dns:///p-0.prefill.ns.svc:50052, dns:///p-1.prefill.ns.svc:50052"),
            (V{"dns:///p-0.prefill.ns.svc:50052", "dns:///p-1.prefill.ns.svc:50052"}));
  EXPECT_EQ(*PrefillPool::SplitTarget("h1:1,h2:2"), (V{"h1:1", "h2:2"}));
  // A YAML folded list (a ConfigMap's) leaves a space after each comma.
  EXPECT_EQ(*PrefillPool::SplitTarget("ipv4:10.0.0.1:1, 10.0.0.2:2"),
            (V{"ipv4:10.0.0.1:1", "ipv4:10.0.0.2:2"}));
  EXPECT_EQ(*PrefillPool::SplitTarget("dns:///prefill:50052"), (V{"dns:///prefill:50052"}));
  for (const char* bad : {"", ",", "ipv4:", " , "}) {
    EXPECT_EQ(PrefillPool::SplitTarget(bad).status().code(), absl::StatusCode::kInvalidArgument)
        << "'" << bad << "'";
  }
  PrefillPool pool("dns:///p-0.prefill:50052,dns:///p-1.prefill:50052",
                   grpc::InsecureChannelCredentials(), grpc::ChannelArguments(), absl::Seconds(10));
  ASSERT_EQ(pool.endpoints().size(), 2u);
  // A request may name a listed endpoint by its host:port.
  auto own = pool.Named("p-1.prefill:50052");
  ASSERT_TRUE(own.ok()) << own.status();
  EXPECT_EQ(own->get(), pool.endpoints()[1]);
}

}  // namespace
}  // namespace tandem
