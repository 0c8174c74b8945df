"""tidelog.agent"""
