#include "models/model_registry.h"

#include <set>
#include <string>
#include <string_view>

#include "models/model_config.h"
#include "gtest/gtest.h"

namespace headroom::models_internal {
namespace {

// The invariants of models/model_registry.h: every name answers for one family only, and every family can be
// parsed, built and selected.
TEST(ModelRegistry, EveryNameBelongsToOneFamily) {
  std::set<std::string_view> model_types, classes;
  for (const ModelFamilyEntry* family : ModelFamilies()) {
    EXPECT_TRUE(model_types.insert(family->model_type).second) << "model_type " << family->model_type;
    for (std::string_view alias : family->model_type_aliases) {
      EXPECT_TRUE(model_types.insert(alias).second) << "model_type alias " << alias;
    }
    for (const ArchitectureClass& architecture : family->classes) {
      EXPECT_TRUE(classes.insert(architecture.name).second) << "class " << architecture.name;
    }
  }
}

TEST(ModelRegistry, EveryFamilyHasAClassAParserAndABuilder) {
  for (const ModelFamilyEntry* family : ModelFamilies()) {
    EXPECT_FALSE(family->model_type.empty());
    EXPECT_FALSE(family->classes.empty()) << family->model_type;
    EXPECT_NE(family->parse, nullptr) << family->model_type;
    EXPECT_NE(family->build, nullptr) << family->model_type;
    EXPECT_EQ(FindFamily(family->model_type), family);
    for (const ArchitectureClass& architecture : family->classes) {
      EXPECT_EQ(FindClass(architecture.name).family, family) << architecture.name;
    }
    if (family->model_type_selects) {
      EXPECT_EQ(FamilyOfModelType(family->model_type), family);
    }
    for (std::string_view alias : family->model_type_aliases) EXPECT_EQ(FamilyOfModelType(alias), family);
  }
}

TEST(ModelRegistry, ListingsReadTheRegistry) {
  size_t classes = 0;
  for (const ModelFamilyEntry* family : ModelFamilies()) classes += family->classes.size();
  EXPECT_EQ(SupportedArchitectures().size(), classes);
  EXPECT_EQ(CnnNames(), (std::vector<std::string>{"resnet50", "vgg16"}));
  EXPECT_EQ(FamilyOfModelType("cnn"), nullptr);  // torchvision CNNs are named by class only
}

}  // namespace
}  // namespace headroom::models_internal
