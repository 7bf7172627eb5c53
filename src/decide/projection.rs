//! A session as the contract shows it: its stored row, with the agent's
//! presence as the presence rules read it now ([`super::presence::shown`],
//! [`super::presence::delivery`]). Here rather than beside the row, so that
//! the rows, beneath every rule, import none.

use super::presence::{delivery, shown};
use super::rows::SessionRow;
use crate::model::{AgentPresence, AgentState, Capabilities, Session};
use crate::time::rfc3339;

impl SessionRow {
    /// The content-free projection, its presence as shown now.
    pub fn projection(&self) -> Session {
        let now = crate::time::now_ms();
        let (state, since) = shown(self, now);
        Session {
            session_id: self.session_id.clone(),
            goal_id: self.goal_id.clone(),
            agent_id: self.agent_id.clone(),
            executor_endpoint_id: self.executor_endpoint_id.clone(),
            host_surface: self.host_surface.clone(),
            capabilities: Capabilities::ATTACHED,
            state: self.state,
            created_at: rfc3339(self.created_at),
            closed_at: self.closed_at.map(rfc3339),
            agent: AgentPresence {
                state,
                since: rfc3339(since),
                delivery: delivery(self, state, now),
                tool: self
                    .agent_tool
                    .clone()
                    .filter(|_| matches!(state, AgentState::Working | AgentState::Stalled)),
                tool_since: self
                    .tool_since
                    .filter(|_| {
                        matches!(state, AgentState::Working | AgentState::Stalled)
                            && self.agent_tool.is_some()
                    })
                    .map(rfc3339),
            },
            continued_in: self.continued_in.clone(),
            continued_from: self.continued_from.clone(),
        }
    }

    /// The projection of a session one of whose permission requests is
    /// pending: its agent, there, is `asking`.
    pub fn projection_asking(&self, asking: bool) -> Session {
        let mut session = self.projection();
        if asking
            && matches!(
                session.agent.state,
                AgentState::Working | AgentState::Waiting | AgentState::Stalled
            )
        {
            session.agent.state = AgentState::Asking;
        }
        session
    }
}
