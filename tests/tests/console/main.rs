//! The console (docs/console.md) in a real browser: Debian's headless Chromium, driven by
//! Playwright's Python package (`tests/console/console.py`) against a slotgate on the fake
//! llama-server. Needs `$SLOTGATE_CONSOLE_PYTHON` and `$SLOTGATE_CHROMIUM`, which
//! `scripts/setup-console.sh` installs and prints (run by a test that finds them unset), and the
//! Rust example policies (`scripts/build-policies.sh`). Not in the fast tier.
//!
//! With `SLOTGATE_SCREENSHOTS=docs/console` the tests write a screenshot of each page there (the
//! pictures of docs/console.md and the README).

mod browser;
