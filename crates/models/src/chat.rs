//! The ChatML chat template of SmolLM2-Instruct.
//!
//! The model file's `tokenizer.chat_template` is a Jinja program; rather than embed a Jinja
//! engine, this module recognizes ChatML templates and renders them directly. For SmolLM2 the
//! template is: a default system turn when the first message is not a system message, then
//! `<|im_start|>{role}\n{content}<|im_end|>\n` per message, then `<|im_start|>assistant\n` when a
//! reply is wanted. The control tokens in the rendered text are recognized by
//! [`Tokenizer::encode`](crate::tokenizer::Tokenizer::encode).
//!
//! ```
//! use tq_models::chat::ChatTemplate;
//!
//! let prompt = ChatTemplate::smollm2().prompt(None, "What is 2+2?");
//! assert_eq!(
//!     prompt,
//!     "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n\
//!      <|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"
//! );
//! ```

use crate::gguf::{Gguf, GgufError};

/// The metadata key holding the Jinja chat template.
pub const CHAT_TEMPLATE_KEY: &str = "tokenizer.chat_template";

/// SmolLM2's default system message (from its chat template).
pub const SMOLLM2_DEFAULT_SYSTEM: &str =
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face";

const IM_START: &str = "<|im_start|>";
const IM_END: &str = "<|im_end|>";

/// Everything that can go wrong reading a chat template.
#[derive(Debug, thiserror::Error)]
pub enum ChatError {
    /// The template key is missing or not a string.
    #[error("cannot read the chat template: {0}")]
    Metadata(#[from] GgufError),
    /// The template is not ChatML, the only kind rendered here.
    #[error("the chat template is not ChatML (no <|im_start|>/<|im_end|> turns): {excerpt:?}")]
    NotChatMl {
        /// The template's first characters.
        excerpt: String,
    },
}

/// Who speaks a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Instructions for the assistant.
    System,
    /// The person talking to the model.
    User,
    /// The model.
    Assistant,
}

impl Role {
    /// The role's name in the template (`system`, `user`, `assistant`).
    pub fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
        }
    }
}

/// One turn of a conversation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// Who speaks.
    pub role: Role,
    /// What is said.
    pub content: String,
}

impl Message {
    /// A message from `role`.
    pub fn new(role: Role, content: impl Into<String>) -> Self {
        Message {
            role,
            content: content.into(),
        }
    }
}

/// A ChatML template, with the system message it inserts when a conversation has none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatTemplate {
    default_system: Option<String>,
}

impl ChatTemplate {
    /// ChatML with an optional default system message.
    pub fn chatml(default_system: Option<&str>) -> Self {
        ChatTemplate {
            default_system: default_system.map(str::to_owned),
        }
    }

    /// SmolLM2-Instruct's template (ChatML, default system [`SMOLLM2_DEFAULT_SYSTEM`]).
    pub fn smollm2() -> Self {
        Self::chatml(Some(SMOLLM2_DEFAULT_SYSTEM))
    }

    /// The template of a GGUF file (`tokenizer.chat_template`).
    pub fn from_gguf(gguf: &Gguf) -> Result<Self, ChatError> {
        Self::from_jinja(gguf.metadata().str(CHAT_TEMPLATE_KEY)?)
    }

    /// Recognizes a ChatML Jinja template and takes its default system message: the literal
    /// text between `<|im_start|>system` + newline and `<|im_end|>`, if the template has one.
    pub fn from_jinja(source: &str) -> Result<Self, ChatError> {
        let is_chatml = source.contains(IM_START)
            && source.contains(IM_END)
            && source.contains("role")
            && source.contains("content");
        if !is_chatml {
            return Err(ChatError::NotChatMl {
                excerpt: source.chars().take(80).collect(),
            });
        }
        // Templates spell the newline either as a real newline inside the string literal or as
        // the escape `\n`.
        let default_system = ["\n", "\\n"].iter().find_map(|newline| {
            let opening = format!("{IM_START}system{newline}");
            let start = source.find(&opening)? + opening.len();
            let len = source[start..].find(IM_END)?;
            Some(source[start..start + len].to_owned())
        });
        Ok(ChatTemplate { default_system })
    }

    /// The system message inserted when the first message is not a system message.
    pub fn default_system(&self) -> Option<&str> {
        self.default_system.as_deref()
    }

    /// Renders `messages`; with `add_generation_prompt`, ends with the opening of an assistant
    /// turn so the model writes the reply.
    pub fn render(&self, messages: &[Message], add_generation_prompt: bool) -> String {
        let mut out = String::new();
        // As in SmolLM2's template: the default system turn goes before the first message
        // unless that message is itself a system message (and not at all for no messages).
        if let (Some(first), Some(system)) = (messages.first(), &self.default_system)
            && first.role != Role::System
        {
            push_turn(&mut out, Role::System, system);
        }
        for message in messages {
            push_turn(&mut out, message.role, &message.content);
        }
        if add_generation_prompt {
            out.push_str(IM_START);
            out.push_str(Role::Assistant.as_str());
            out.push('\n');
        }
        out
    }

    /// A single-turn prompt: `system` (or the default) and `user`, ready for the reply.
    pub fn prompt(&self, system: Option<&str>, user: &str) -> String {
        let mut messages = Vec::with_capacity(2);
        if let Some(system) = system {
            messages.push(Message::new(Role::System, system));
        }
        messages.push(Message::new(Role::User, user));
        self.render(&messages, true)
    }
}

fn push_turn(out: &mut String, role: Role, content: &str) {
    out.push_str(IM_START);
    out.push_str(role.as_str());
    out.push('\n');
    out.push_str(content);
    out.push_str(IM_END);
    out.push('\n');
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMOLLM2_JINJA: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

    #[test]
    fn the_smollm2_template_yields_its_default_system_message() {
        let template = ChatTemplate::from_jinja(SMOLLM2_JINJA).unwrap();
        assert_eq!(template, ChatTemplate::smollm2());
        let escaped = SMOLLM2_JINJA.replace('\n', "\\n");
        assert_eq!(
            ChatTemplate::from_jinja(&escaped).unwrap(),
            ChatTemplate::smollm2()
        );
    }

    #[test]
    fn an_explicit_system_message_replaces_the_default() {
        let template = ChatTemplate::smollm2();
        assert_eq!(
            template.prompt(Some("Be brief."), "Hi"),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn multi_turn_conversations_render_every_turn() {
        let template = ChatTemplate::chatml(None);
        let messages = [
            Message::new(Role::User, "Hi"),
            Message::new(Role::Assistant, "Hello!"),
            Message::new(Role::User, "Bye"),
        ];
        assert_eq!(
            template.render(&messages, false),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n"
        );
        assert_eq!(
            ChatTemplate::smollm2().render(&[], true),
            "<|im_start|>assistant\n"
        );
    }

    #[test]
    fn non_chatml_templates_are_refused() {
        let llama2 = "{{ bos_token }}{% for message in messages %}[INST] {{ message['content'] }} [/INST]{% endfor %}";
        assert!(matches!(
            ChatTemplate::from_jinja(llama2),
            Err(ChatError::NotChatMl { .. })
        ));
    }
}
