//! Tables for people: columns as wide as their widest cell (a 44-character worktree name
//! widens its column instead of breaking every row), two spaces between columns, the last
//! column never padded.

/// A table: a header row, then rows of as many cells.
pub struct Table {
    rows: Vec<Vec<String>>,
    right: Vec<bool>,
}

impl Table {
    /// A table with these column headers, each left-aligned.
    pub fn new(headers: &[&str]) -> Table {
        Table {
            rows: vec![headers.iter().map(|h| h.to_string()).collect()],
            right: vec![false; headers.len()],
        }
    }

    /// Right-aligns column `i` (numbers, sizes).
    pub fn right(mut self, i: usize) -> Table {
        self.right[i] = true;
        self
    }

    /// Adds a row; missing cells are empty, extra ones are dropped.
    pub fn row<S: ToString>(&mut self, cells: impl IntoIterator<Item = S>) {
        let mut row: Vec<String> = cells.into_iter().map(|c| c.to_string()).collect();
        row.resize(self.right.len(), String::new());
        self.rows.push(row);
    }

    /// Whether it has no row below the header.
    pub fn is_empty(&self) -> bool {
        self.rows.len() == 1
    }

    /// The table as lines, each ending with a newline.
    pub fn render(&self) -> String {
        let n = self.right.len();
        let width = |i: usize| {
            self.rows
                .iter()
                .map(|r| r[i].chars().count())
                .max()
                .unwrap_or(0)
        };
        let widths: Vec<usize> = (0..n).map(width).collect();
        let mut out = String::new();
        for row in &self.rows {
            let mut line = String::new();
            for (i, cell) in row.iter().enumerate() {
                if i > 0 {
                    line.push_str("  ");
                }
                let pad = widths[i] - cell.chars().count();
                let last = i + 1 == n;
                if self.right[i] {
                    line.push_str(&" ".repeat(pad));
                    line.push_str(cell);
                } else {
                    line.push_str(cell);
                    if !last {
                        line.push_str(&" ".repeat(pad));
                    }
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::Table;

    #[test]
    fn columns_are_as_wide_as_their_widest_cell() {
        let long = "a-worktree-name-of-forty-four-characters-xyz";
        let mut t = Table::new(&["WORKTREE", "SIZE", "NOTE"]).right(1);
        t.row(["r/short", "12 B", "x"]);
        t.row([format!("r/{long}"), "1.5 GiB".into(), String::new()]);
        let out = t.render();
        let lines: Vec<&str> = out.lines().collect();
        // Every row's second column starts at the same place, after the longest name.
        let at = 2 + long.len() + 2;
        assert_eq!(
            &lines[0][..at + 7],
            &format!("{:<w$}  {:>7}", "WORKTREE", "SIZE", w = at - 2)
        );
        assert_eq!(&lines[1][at..at + 7], "   12 B");
        assert_eq!(&lines[2][at..at + 7], "1.5 GiB");
        // No padding after the last column, nor trailing blanks.
        assert!(lines.iter().all(|l| !l.ends_with(' ')), "{out:?}");
        assert!(Table::new(&["A"]).is_empty());
    }
}
