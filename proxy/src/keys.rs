//! How the proxy names its keys: `{upstream}` (the upstream's own), `{upstream}:{model}`,
//! `{upstream}:tenant:{tenant}` (a tenant's windows at an upstream), `budget:tenant:{tenant}`,
//! `budget:tier:{tier}` and `budget:upstream:{upstream}` (budgets); a key whose limits changed
//! at a reload is stored as `{key}@{limits}`.

/// What follows an upstream's name in its tenants' keys: `{upstream}:tenant:{tenant}`.
pub(crate) const TENANT_PART: &str = "tenant:";

/// The start of a budget's key: a tenant's (`budget:tenant:{name}`), a tier's shared one
/// (`budget:tier:{name}`) and an upstream's (`budget:upstream:{name}`).
pub(crate) const BUDGET: &str = "budget:";

/// Whether `model` is `name` or one of its family (`name` then `-`, `:`, `@` or `.`).
pub(crate) fn family_of(model: &str, name: &str) -> bool {
    model
        .strip_prefix(name)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with(['-', ':', '@', '.']))
}
