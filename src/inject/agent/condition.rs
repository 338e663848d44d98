//! An Elastic Agent input's `condition` with the agent's own leader in it
//! (`${kubernetes_leaderelection.leader} == true`), split into what the
//! leader-only file keeps: nothing when that is the whole condition, the
//! other terms when it is one term of a top-level `and` chain, and a
//! refusal for anything else (an `or`, a `not`, the leader compared with
//! `false`, a `|` fallback), whose meaning without that term is not the
//! condition on the leader.
//!
//! The grammar is the agent's EQL, elastic/elastic-agent
//! internal/pkg/eql/Eql.g4 @000546bd: `and`/`AND` bind tighter than
//! `or`/`OR` and looser than `not`, `==` and the rest (the order of the
//! `exp` alternatives, lines 61-83), so the terms of a chain of
//! top-level `and`s (outside parentheses, quotes, `${…}`, `[…]`, `{…}`)
//! are independent operands: dropping one that is always true on the
//! leader leaves an equal condition there.

/// The provider's name, as every reference to its variables spells it.
pub const PROVIDER: &str = "kubernetes_leaderelection";

/// Whether `text` names the provider's variables.
pub fn mentions(text: &str) -> bool {
    text.contains(PROVIDER)
}

/// What the leader-only file keeps of `condition`, one that [`mentions`]
/// the provider: `None` when the condition is only the leader, else the
/// other terms; an error saying why when it cannot be split.
pub fn without_leader(condition: &str) -> Result<Option<String>, String> {
    let terms = and_terms(condition)?;
    let (leader, rest): (Vec<&str>, Vec<&str>) = terms.iter().partition(|t| is_leader(t));
    if leader.len() != 1 {
        return Err(format!(
            "its condition {condition:?} names ${{{PROVIDER}.leader}} {} times as a term of its own",
            leader.len()
        ));
    }
    if let Some(other) = rest.iter().find(|t| mentions(t)) {
        return Err(format!(
            "its condition {condition:?} uses {PROVIDER} in {other:?}, which is not `${{{PROVIDER}.leader}} == true`"
        ));
    }
    Ok((!rest.is_empty()).then(|| rest.join(" and ")))
}

/// The leader term: `${kubernetes_leaderelection.leader}`, alone or
/// `== true` either way round, in parentheses or not.
fn is_leader(term: &str) -> bool {
    let mut term = term.trim();
    while let Some(inner) = wrapped(term) {
        term = inner.trim();
    }
    let compact: String = term.chars().filter(|c| !c.is_whitespace()).collect();
    let var = format!("${{{PROVIDER}.leader}}");
    compact == var
        || ["true", "TRUE"]
            .iter()
            .any(|t| compact == format!("{var}=={t}") || compact == format!("{t}=={var}"))
}

/// `inner` when `term` is `(inner)`, one pair of parentheses around it all.
fn wrapped(term: &str) -> Option<&str> {
    let inner = term.strip_prefix('(')?.strip_suffix(')')?;
    // `(a) and (b)` is no pair around it all: `a) and (b` is unbalanced.
    scan(inner).1.then_some(inner)
}

/// The operands of `condition`'s top-level `and` chain, trimmed; an error
/// for a top-level `or`, which binds looser and so is the whole condition.
fn and_terms(condition: &str) -> Result<Vec<&str>, String> {
    let (words, balanced) = scan(condition);
    if !balanced {
        return Err(format!(
            "its condition {condition:?} has unbalanced brackets or quotes"
        ));
    }
    let mut terms = Vec::new();
    let mut start = 0;
    for (at, depth, word) in words {
        if depth != 0 {
            continue;
        }
        match word {
            "and" | "AND" => {
                terms.push(condition[start..at].trim());
                start = at + word.len();
            }
            "or" | "OR" => {
                return Err(format!(
                    "its condition {condition:?} is an `or`: without the leader term it would not mean the same on the leader"
                ));
            }
            _ => {}
        }
    }
    terms.push(condition[start..].trim());
    if terms.iter().any(|t| t.is_empty()) {
        return Err(format!("its condition {condition:?} is not a condition"));
    }
    Ok(terms)
}

/// Every word of `text` outside quotes, with its byte offset and the
/// nesting depth of `(`, `[`, `{` (and `${`) it stands at; and whether
/// every bracket and quote closes, none before it opened.
fn scan(text: &str) -> (Vec<(usize, i32, &str)>, bool) {
    // EQL's NAME and VNAME characters: `and` inside `a.and` is no keyword.
    let word_char = |c: char| c.is_ascii_alphanumeric() || "_-/.".contains(c);
    let mut out = Vec::new();
    let mut depth = 0;
    let mut quote: Option<char> = None;
    let mut word: Option<usize> = None;
    let mut balanced = true;
    for (at, c) in text.char_indices() {
        if let Some(q) = quote {
            if c == q {
                quote = None;
            }
            continue;
        }
        match (word, word_char(c)) {
            (None, true) => word = Some(at),
            (Some(from), false) => {
                out.push((from, depth, &text[from..at]));
                word = None;
            }
            _ => {}
        }
        match c {
            '\'' | '"' => quote = Some(c),
            '(' | '[' | '{' => depth += 1,
            ')' | ']' | '}' => {
                depth -= 1;
                balanced &= depth >= 0;
            }
            _ => {}
        }
    }
    if let Some(from) = word {
        out.push((from, depth, &text[from..]));
    }
    (out, balanced && depth == 0 && quote.is_none())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_leader_alone_leaves_no_condition() {
        for c in [
            "${kubernetes_leaderelection.leader} == true",
            "${kubernetes_leaderelection.leader}==TRUE",
            "true == ${kubernetes_leaderelection.leader}",
            "( ${kubernetes_leaderelection.leader} == true )",
            "${kubernetes_leaderelection.leader}",
        ] {
            assert_eq!(without_leader(c), Ok(None), "{c}");
        }
    }

    #[test]
    fn the_other_terms_of_an_and_chain_stay() {
        assert_eq!(
            without_leader(
                "${host.platform} == 'linux' and ${kubernetes_leaderelection.leader} == true AND not ${x.y}"
            ),
            Ok(Some(
                "${host.platform} == 'linux' and not ${x.y}".to_owned()
            ))
        );
        // `and` inside quotes, parentheses or a name is no operator.
        assert_eq!(
            without_leader(
                "(${a} == 'x and y' or ${b}) and ${kubernetes_leaderelection.leader} == true and ${c.and} == 1"
            ),
            Ok(Some(
                "(${a} == 'x and y' or ${b}) and ${c.and} == 1".to_owned()
            ))
        );
    }

    #[test]
    fn what_does_not_mean_the_same_on_the_leader_is_refused() {
        for c in [
            "${kubernetes_leaderelection.leader} == true or ${a} == 1",
            "${kubernetes_leaderelection.leader} == false",
            "not ${kubernetes_leaderelection.leader}",
            "(${kubernetes_leaderelection.leader} == true or ${a}) and ${b}",
            "${kubernetes_leaderelection.leader|x.y} == true",
            "${kubernetes_leaderelection.leader} == true and ${kubernetes_leaderelection.leader}",
            "${kubernetes_leaderelection.leader} == true and",
            "(${a}) and (${kubernetes_leaderelection.leader} == true)) or (${b})",
        ] {
            assert!(without_leader(c).is_err(), "{c}");
        }
    }
}
