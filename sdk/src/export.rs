//! `export_policy!`: the ABI v1 exports for a [`Policy`](crate::Policy), emitted on wasm32 only.

/// Exports a [`Policy`](crate::Policy) as a slotgate ABI v1 module.
///
/// `export_policy!(MyPolicy);` emits `slotgate_abi_version`, `slotgate_alloc`, `slotgate_evaluate`
/// and `slotgate_validate_settings`; `export_policy!(MyPolicy, on_complete);` also emits
/// `slotgate_on_complete`, so the host calls [`Policy::on_complete`](crate::Policy::on_complete)
/// after every response. Leave the flag out when the policy does not need it: each call of a v1
/// module costs the host a fresh instance.
///
/// The exports exist only when compiling for `wasm32`. Natively the macro only checks that the type
/// implements `Policy`, so the crate builds and unit-tests like any other.
///
/// A policy crate calls this once, at its root, and needs `crate-type = ["cdylib", "rlib"]`. The
/// generated functions carry `#[no_mangle]` and an `unsafe` block, allowed item by item: the crate's
/// `unsafe_code` lint must be `deny`, not `forbid`.
#[macro_export]
macro_rules! export_policy {
    (@check $policy:ty) => {
        const _: () = {
            fn assert_policy<P: $crate::Policy>() {}
            let _ = assert_policy::<$policy>;
        };
    };
    (@name) => {
        /// The policy's own name (its crate's), in the custom section `slotgate.policy`: the host
        /// keeps its budgets under it unless the operator names the policy, so renaming the module's
        /// file loses nothing.
        #[cfg(target_arch = "wasm32")]
        #[allow(unsafe_code, reason = "a custom section is a #[link_section] static")]
        #[link_section = "slotgate.policy"]
        #[used]
        static __SLOTGATE_POLICY_NAME: [u8; env!("CARGO_PKG_NAME").len()] =
            $crate::__guest::name_bytes(env!("CARGO_PKG_NAME"));
    };
    // An export `fn $export(ptr, len) -> i64` over the input the host wrote, answered by
    // `__guest::$handler` with the settings kept in `__SLOTGATE_SETTINGS`.
    (@call $policy:ty, $export:ident => $handler:ident) => {
        #[allow(unsafe_code, reason = "the policy ABI's exports are #[no_mangle] functions over raw guest memory")]
        #[no_mangle]
        pub extern "C" fn $export(ptr: i32, len: i32) -> i64 {
            // SAFETY: the host passes a buffer from `slotgate_alloc` holding `len` bytes it wrote.
            let input = unsafe { $crate::__guest::input(ptr, len) };
            $crate::__guest::$handler::<$policy>(input, &__SLOTGATE_SETTINGS)
        }
    };
    ($policy:ty) => {
        $crate::export_policy!(@check $policy);

        /// The policy's settings, parsed once when the host validates them (see
        /// `slotgate_sdk::__guest::Kept`).
        #[cfg(target_arch = "wasm32")]
        #[doc(hidden)]
        static __SLOTGATE_SETTINGS: $crate::__guest::Kept<<$policy as $crate::Policy>::Settings> =
            $crate::__guest::Kept::new();

        $crate::export_policy!(@name);

        #[cfg(target_arch = "wasm32")]
        const _: () = {
            #[allow(unsafe_code, reason = "the policy ABI's exports are #[no_mangle] functions over raw guest memory")]
            #[no_mangle]
            pub extern "C" fn slotgate_abi_version() -> i32 {
                $crate::ABI_VERSION as i32
            }

            #[allow(unsafe_code, reason = "the policy ABI's exports are #[no_mangle] functions over raw guest memory")]
            #[no_mangle]
            pub extern "C" fn slotgate_alloc(len: i32) -> i32 {
                $crate::__guest::alloc(len)
            }

            $crate::export_policy!(@call $policy, slotgate_evaluate => evaluate);

            $crate::export_policy!(@call $policy, slotgate_validate_settings => validate_settings);
        };
    };
    ($policy:ty, on_complete) => {
        $crate::export_policy!($policy);

        #[cfg(target_arch = "wasm32")]
        const _: () = {
            $crate::export_policy!(@call $policy, slotgate_on_complete => on_complete);
        };
    };
}

/// Exports a [`Policy`](crate::Policy) as a v2 component of the world `slotgate:policy@2.0.0`
/// (`wit/policy.wit`). Needs the SDK's `v2` feature.
///
/// `export_component!(MyPolicy);` exports `validate-settings`, `evaluate` and `on-complete`;
/// `export_component!(MyPolicy, on_complete);` also asks the host to call
/// [`Policy::on_complete`](crate::Policy::on_complete) after every request the policy allowed
/// (otherwise it never does, which saves an instance per request).
///
/// Build it as a v1 module is built (`cargo build --target wasm32-unknown-unknown`): the result is
/// a core module carrying the contract, which slotgate makes a component when it loads it, and
/// `slotgate policy component` writes as a standalone component for other tools.
#[macro_export]
macro_rules! export_component {
    ($policy:ty) => {
        $crate::export_component!(@with $policy, false);
    };
    ($policy:ty, on_complete) => {
        $crate::export_component!(@with $policy, true);
    };
    (@with $policy:ty, $completions:expr) => {
        $crate::export_policy!(@check $policy);

        $crate::export_policy!(@name);

        #[cfg(target_arch = "wasm32")]
        #[allow(unsafe_code, reason = "the component's exports are generated #[export_name] functions")]
        const _: () = {
            struct SlotgateComponent;

            impl $crate::__component::Guest for SlotgateComponent {
                fn validate_settings(
                    settings: String,
                ) -> Result<$crate::__component::SettingsVerdict, String> {
                    $crate::__component::validate_settings::<$policy>(settings, $completions)
                }

                fn evaluate(
                    settings: String,
                    input: $crate::__component::Evaluation,
                ) -> $crate::__component::WitDecision {
                    $crate::__component::evaluate::<$policy>(settings, input)
                }

                fn on_complete(settings: String, completion: $crate::__component::WitCompletion) {
                    $crate::__component::on_complete::<$policy>(settings, completion)
                }
            }

            $crate::__component::bindings::__export_policy_world!(SlotgateComponent with_types_in $crate::__component::bindings);
        };
    };
}
