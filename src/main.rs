//! The `cairn` binary: all of it is the library's hidden entry, so that the modules behind the
//! command line stay crate-private.

fn main() {
    cairn::testing::main()
}
