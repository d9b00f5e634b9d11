// Reading a rendered screen, shared by the tmux integration tests (common::screen) and the
// live view's unit tests (include!d there): no inner attributes, so that include! takes it.

/// Every decimal number on the line that is not followed by its unit (or is not a share): a
/// value the terminal's width cut.
pub fn cut_values(line: &str) -> Vec<String> {
    let tokens: Vec<&str> = line.split_whitespace().collect();
    let units = ["ns", "µs", "ms", "s"];
    let mut cut = Vec::new();
    for (i, token) in tokens.iter().enumerate() {
        let number = token.trim_start_matches(['≤', '›']);
        if !number.contains('.') || number.ends_with('%') || number.parse::<f64>().is_err() {
            continue;
        }
        if !tokens.get(i + 1).is_some_and(|next| units.contains(next)) {
            cut.push(format!("{token} {}", tokens.get(i + 1).unwrap_or(&"")));
        }
    }
    cut
}
