int plain_value();
int main() {
  std::printf("%s %d %s\n", in_pch(), plain_value(), __FILE__);
  return 0;
}
