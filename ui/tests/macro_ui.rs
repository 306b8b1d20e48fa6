//! Compile-time behaviour of `#[tollgate::limit]`: the signatures it accepts, and the exact
//! messages of the mistakes it refuses.

#[test]
fn signatures_that_compile_and_mistakes_that_do_not() {
    let cases = trybuild::TestCases::new();
    cases.pass("tests/ui/pass/*.rs");
    cases.compile_fail("tests/ui/fail/*.rs");
}
