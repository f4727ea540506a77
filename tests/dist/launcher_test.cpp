// The --devices launcher without MPI: the device list parser, mpirun's command line and the single-process
// communicator that a run on one device uses.
#include <gtest/gtest.h>

#include <algorithm>

#include "core/error.h"
#include "dist/communicator.h"
#include "dist/launcher.h"

using namespace lmtune;

TEST(DeviceList, ParsesDistinctIndices) {
  EXPECT_EQ(dist::parse_device_list("--devices", "0,1,3"), (std::vector<int>{0, 1, 3}));
  EXPECT_EQ(dist::parse_device_list("--devices", "2"), (std::vector<int>{2}));
}

TEST(DeviceList, RejectsBadLists) {
  for (const char* bad : {"", "0,,1", "a", "-1", "0,0", "1.5", "0,"}) {
    SCOPED_TRACE(bad);
    try {
      dist::parse_device_list("--devices", bad);
      ADD_FAILURE() << "accepted";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("--devices"), std::string::npos) << e.what();
    }
  }
}

TEST(Launcher, RunsTheCommandOnThisHostOnly) {
  const std::vector<std::string> cmd = dist::mpirun_command("/opt/mpi/bin/mpirun", 3, {"/x/lmtune", "train", "r.yaml"});
  ASSERT_GE(cmd.size(), 6u);
  EXPECT_EQ(cmd[0], "/opt/mpi/bin/mpirun");
  EXPECT_EQ(cmd[1], "-np");
  EXPECT_EQ(cmd[2], "3");
  auto has_pair = [&](const std::string& a, const std::string& b) {
    for (size_t i = 0; i + 1 < cmd.size(); ++i)
      if (cmd[i] == a && cmd[i + 1] == b) return true;
    return false;
  };
  EXPECT_TRUE(has_pair("plm", "isolated"));  // no ssh needed
  EXPECT_TRUE(has_pair("btl", "self,vader"));
  EXPECT_TRUE(has_pair("--bind-to", "none"));
  EXPECT_EQ(std::vector<std::string>(cmd.end() - 3, cmd.end()),
            (std::vector<std::string>{"/x/lmtune", "train", "r.yaml"}));
}

TEST(SingleProcess, CollectivesAreIdentities) {
  auto c = dist::single_process();
  EXPECT_EQ(c->rank(), 0);
  EXPECT_EQ(c->size(), 1);
  EXPECT_TRUE(c->is_root());
  std::vector<double> d{1.5, -2};
  c->all_reduce_sum(d);
  EXPECT_EQ(d, (std::vector<double>{1.5, -2}));
  std::vector<float> f{3, 4};
  c->start_all_reduce_sum(f)->wait();
  EXPECT_EQ(f, (std::vector<float>{3, 4}));
  EXPECT_EQ(c->all_gather(7.0), std::vector<double>{7.0});
  EXPECT_NE(c->where().find("rank 0 of 1 on "), std::string::npos);
}
