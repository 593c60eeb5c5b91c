//! How a needle prompt addresses the model: through its chat template, or as plain text to
//! complete (a base model such as Gemma 3 270M has no template).

use crate::chat::ChatTemplate;
use crate::gguf::Gguf;

/// The framing of the haystack, question and answer cue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PromptStyle {
    /// The model's chat template: the haystack, a blank line and the question form the user
    /// turn; the spec's `answer_prefix`, if any, opens the assistant turn.
    Chat(ChatTemplate),
    /// A base model completes text: `{haystack}\n\nQuestion: {question}\nAnswer:`, followed
    /// by ` {answer_prefix}` when the spec has one.
    Completion,
}

impl PromptStyle {
    /// The style of a model file: its chat template when it has one this crate renders
    /// (ChatML), completion otherwise — a template that cannot be rendered faithfully is not
    /// replaced by another model's.
    pub fn for_model(gguf: &Gguf) -> Self {
        match ChatTemplate::from_gguf(gguf) {
            Ok(template) => PromptStyle::Chat(template),
            Err(_) => PromptStyle::Completion,
        }
    }

    /// The prompt text and the byte offset where `haystack` starts in it.
    pub fn render(
        &self,
        haystack: &str,
        question: &str,
        answer_prefix: Option<&str>,
    ) -> (String, usize) {
        match self {
            PromptStyle::Chat(template) => {
                let content = format!("{haystack}\n\n{question}");
                let mut text = template.prompt(None, &content);
                // The system turn cannot contain the whole user turn, so the first match is
                // the user turn.
                let start = text.find(&content).unwrap_or(0);
                if let Some(prefix) = answer_prefix {
                    text.push_str(prefix);
                }
                (text, start)
            }
            PromptStyle::Completion => {
                let mut text = format!("{haystack}\n\nQuestion: {question}\nAnswer:");
                if let Some(prefix) = answer_prefix {
                    text.push(' ');
                    text.push_str(prefix);
                }
                (text, 0)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn completion_asks_and_cues_the_answer() {
        let style = PromptStyle::Completion;
        let (text, start) = style.render("Hay. Needle.", "What?", None);
        assert_eq!(text, "Hay. Needle.\n\nQuestion: What?\nAnswer:");
        assert_eq!(start, 0);
        let (text, _) = style.render("Hay.", "What?", Some("The key is"));
        assert_eq!(text, "Hay.\n\nQuestion: What?\nAnswer: The key is");
    }

    #[test]
    fn chat_puts_the_prefix_in_the_assistant_turn() {
        let style = PromptStyle::Chat(ChatTemplate::chatml(None));
        let (text, start) = style.render("Hay.", "What?", Some("The key is"));
        assert_eq!(&text[start..start + 4], "Hay.");
        assert!(
            text.ends_with("<|im_start|>assistant\nThe key is"),
            "{text}"
        );
        let (plain, _) = style.render("Hay.", "What?", None);
        assert!(plain.ends_with("<|im_start|>assistant\n"), "{plain}");
    }
}
