//! How loading a policy, or one call into it, fails: leaves that the ABI helpers and the module
//! loader both use.

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The file could not be read: missing, unreadable, a directory.
    #[error("cannot read the module file: {0}")]
    Read(#[source] std::io::Error),
    #[error("module is {size} bytes, over the {limit}-byte limit")]
    TooLarge { size: usize, limit: usize },
    #[error("not a valid wasm module: {0}")]
    Compile(String),
    #[error("ABI: {0}")]
    Abi(String),
    #[error("settings rejected: {0}")]
    Settings(String),
    #[error("its budgets would be `{key}`'s, as are policy `{other}`'s: give each its own `name`")]
    SharedState { key: String, other: String },
    #[error(transparent)]
    Eval(#[from] EvalError),
}

/// Why one evaluation failed. Its store is discarded either way.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EvalError {
    #[error("trapped: {0}")]
    Trap(String),
    #[error("deadline exceeded")]
    Timeout,
    #[error("fuel exhausted")]
    Fuel,
    #[error("memory limit exceeded")]
    Memory,
    #[error("invalid output: {0}")]
    InvalidOutput(String),
    #[error("ABI violation: {0}")]
    Abi(String),
}

impl EvalError {
    /// The `kind` label of `slotgate_policy_errors_total`.
    pub fn kind(&self) -> &'static str {
        match self {
            EvalError::Trap(_) => "trap",
            EvalError::Timeout => "timeout",
            EvalError::Fuel => "fuel",
            EvalError::Memory => "memory",
            EvalError::InvalidOutput(_) | EvalError::Abi(_) => "invalid_output",
        }
    }
}
